"""Handlers of the integrity operations: SCRUB, VERIFY and CORRUPT (see ``safeguards.py``).

SCRUB runs one pass and answers with its counts, per tier; it can take minutes on a large store, so the
dispatcher runs it as a task (other requests are served meanwhile). It stays for clients that speak it; a pass
started with SCRUB_START instead answers at once, reports progress on SCRUB_STATUS, stops on SCRUB_CANCEL and
when its client stops asking (``scrub_passes.py``): what ``kvstore scrub`` uses.
VERIFY is a connector's report of a comparison of computed KV with stored chunks. CORRUPT is a client's report
that a view it was handed failed its checksum: the daemon does not take the client's word for it, it re-hashes
the chunk's host slot itself and repairs or drops only what fails there.
"""

from __future__ import annotations

from typing import Any

from ...protocol import messages as m
from ...protocol.wire import Op, ok_reply
from .service import Service
from .session import Session


Frames = list[Any]


def handle_scrub(svc: Service, s: Session, h: dict, frames: list) -> Any:
    req = m.Scrub.parse(h)

    async def scrub() -> Frames:
        report = await svc.safeguards.scrubber.scrub(req.rate)
        return [ok_reply(h["id"], scrub=report.as_dict())]
    return scrub()


def handle_scrub_start(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    req = m.ScrubStart.parse(h)
    started = svc.safeguards.passes.start(req.rate, req.keepalive)
    return [ok_reply(h["id"], **started.status())]


def handle_scrub_status(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    req = m.ScrubPassId.parse(h)
    return [ok_reply(h["id"], **svc.safeguards.passes.status(req.pass_id))]


def handle_scrub_cancel(svc: Service, s: Session, h: dict, frames: list) -> Any:
    req = m.ScrubPassId.parse(h)
    if req.pass_id:
        svc.safeguards.passes.find(req.pass_id)   # an unknown pass: the error at once, not from the task

    async def cancel() -> Frames:
        return [ok_reply(h["id"], stopped=await svc.safeguards.passes.cancel(req.pass_id))]
    return cancel()


def handle_verify(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    req = m.VerifyReport.parse(h)
    dropped = svc.safeguards.verified(req.namespace, req.keys, req.checks, req.mismatches, req.max_difference,
                                    req.first_bad)
    return [ok_reply(h["id"], dropped=dropped)]


def handle_corrupt(svc: Service, s: Session, h: dict, frames: list) -> Any:
    req = m.Keys.parse(h)
    guards = svc.safeguards
    guards.reported += len(req.keys)
    entries = svc.store.entries(req.keys)

    async def recheck() -> Frames:
        bad = await guards.integrity.check_host(entries)
        dropped = guards.integrity.report(bad, "host", f"client {s.client_id}")
        return [ok_reply(h["id"], confirmed=len(bad), dropped=dropped)]
    return recheck()


INTEGRITY_HANDLERS = {Op.SCRUB: handle_scrub, Op.VERIFY: handle_verify, Op.CORRUPT: handle_corrupt,
                      Op.SCRUB_START: handle_scrub_start, Op.SCRUB_STATUS: handle_scrub_status,
                      Op.SCRUB_CANCEL: handle_scrub_cancel}
