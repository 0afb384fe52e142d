"""Scrub passes started on request (``kvstore scrub``): each one a task the daemon owns and its client keeps alive.

SCRUB_START starts a pass and answers at once with its id; SCRUB_STATUS answers how far the pass has got, and its
report once it has ended; SCRUB_CANCEL stops one pass, or every pass clients started. A client that asks for a
pass also promises to ask how it is doing: a pass that hears nothing from its client for ``keepalive`` seconds
(the client was killed, or its machine went away) is stopped, so nothing runs for hours for a client that left.
A finished pass keeps its report until its client reads it, or until ``MAX_FINISHED`` newer ones push it out.
The background scrub (``--scrub-rate``) is not one of these: it belongs to the daemon's settings.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from ... import logs
from ...errors import BadRequestError
from ...store.scrub import Scrubber, ScrubProgress, ScrubReport

REAP_INTERVAL_S = 0.5   # how often passes whose client went quiet are looked for
MAX_FINISHED = 16       # finished passes whose report nobody read yet, kept at most


@dataclass
class ScrubPass:
    id: int
    keepalive: float
    deadline: float
    progress: ScrubProgress = field(default_factory=ScrubProgress)
    task: "asyncio.Task[ScrubReport] | None" = None

    @property
    def done(self) -> bool:
        return self.task is not None and self.task.done()

    def status(self) -> dict[str, Any]:
        """The SCRUB_STATUS reply's fields: the progress, and the report once the pass has ended."""
        reply: dict[str, Any] = {"pass": self.id, "state": "done" if self.done else "running",
                                 "progress": self.progress.as_dict()}
        if self.done and self.task is not None:
            failed = None if self.task.cancelled() else self.task.exception()
            if self.task.cancelled() or failed is not None:
                reply["state"], reply["error"] = "failed", repr(failed) if failed else "cancelled"
            else:
                reply["scrub"] = self.task.result().as_dict()
        return reply


class ScrubPasses:
    """The passes clients started; the only code that starts, stops or forgets one."""

    def __init__(self, scrubber: Scrubber) -> None:
        self.scrubber = scrubber
        self.passes: dict[int, ScrubPass] = {}
        self._ids = itertools.count(1)
        self.orphaned = 0   # passes stopped because their client stopped asking

    def start(self, rate: int, keepalive: float) -> ScrubPass:
        """Start a pass at ``rate`` bytes/s (0: no bound) that stops unless asked about every ``keepalive`` s."""
        p = ScrubPass(next(self._ids), keepalive, time.monotonic() + keepalive)
        entries = self.scrubber.snapshot()
        p.progress.plan(entries)   # now, so that the first answer already says what the pass will check
        p.task = asyncio.get_running_loop().create_task(self.scrubber.scrub(rate, progress=p.progress,
                                                                            entries=entries))
        self.passes[p.id] = p
        self._forget_old()
        logs.info("scrub_started", id=p.id, rate=rate, chunks=p.progress.chunks_total)
        return p

    def status(self, pass_id: int) -> dict[str, Any]:
        """How far pass ``pass_id`` has got (its deadline moves on); once ended, its report, given out once."""
        p = self.find(pass_id)
        p.deadline = time.monotonic() + p.keepalive
        reply = p.status()
        if p.done:
            del self.passes[p.id]
        return reply

    async def cancel(self, pass_id: int) -> list[dict[str, Any]]:
        """Stop pass ``pass_id`` (0: every running one) and wait for it to end; the final status of each. A pass
        stopped for another client (0) keeps its report for its own client, which learns it was stopped."""
        chosen = [p for p in self.passes.values() if not p.done] if pass_id == 0 else [self.find(pass_id)]
        for p in chosen:
            p.progress.stop.set()
        await asyncio.gather(*(p.task for p in chosen if p.task is not None), return_exceptions=True)
        if pass_id:
            self.passes.pop(pass_id, None)
        logs.info("scrub_stopped", passes=[p.id for p in chosen])
        return [p.status() for p in chosen]

    async def reap(self) -> None:
        """Until cancelled (the daemon stops): stop passes whose client went quiet. Then stop every pass."""
        try:
            while True:
                await asyncio.sleep(REAP_INTERVAL_S)
                now = time.monotonic()
                for p in list(self.passes.values()):
                    if not p.done and now > p.deadline and not p.progress.stop.is_set():
                        self.orphaned += 1
                        logs.warning("scrub_orphaned", id=p.id, quiet_s=p.keepalive,
                                     checked=p.progress.chunks_done, of=p.progress.chunks_total)
                        p.progress.stop.set()
        finally:
            for p in self.passes.values():
                p.progress.stop.set()
            await asyncio.gather(*(p.task for p in self.passes.values() if p.task is not None),
                                 return_exceptions=True)

    def find(self, pass_id: int) -> ScrubPass:
        """The pass ``pass_id``; BadRequestError when there is none."""
        p = self.passes.get(pass_id)
        if p is None:
            raise BadRequestError(f"no scrub pass {pass_id} here: it ended and its report was read, was stopped, "
                                  f"or the daemon restarted; start another with kvstore scrub")
        return p

    def _forget_old(self) -> None:
        finished = [p for p in self.passes.values() if p.done]
        for p in finished[:max(0, len(finished) - MAX_FINISHED)]:
            del self.passes[p.id]
