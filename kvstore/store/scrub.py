"""Scrub: one pass over every tier, checking every copy of every chunk against the chunk's checksum.

A pass takes a snapshot of the index and, chunk by chunk, re-hashes the host slot (on the checksummer's worker,
the slot held while it reads), reads and checks the disk file (on the tier manager's pool, into a scratch
buffer: the host copy is not touched) and copies the GPU copy to host memory and hashes it (the copy runs on the
event loop, so the slot cannot be freed under it; a GPU tier is small next to DRAM). A copy that fails goes to
the Store's damage path: repaired from an intact copy in another tier, or dropped with its continuations. Chunks
whose sum is still being taken, and chunks that moved or went while the pass reached them, are skipped, not
counted. The remote store is shared by many daemons and checked on every fetch; a pass does not walk it.

Rate. ``rate`` bounds the bytes checked per second (0: as fast as the worker goes): after each chunk the pass
sleeps until its bytes fit the budget, so a background scrub (``--scrub-rate``) costs a known share of memory
bandwidth and one worker thread, and never holds the event loop longer than one chunk's bookkeeping.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .. import logs
from .entry import DiskState, Entry
from .integrity import Integrity, checksum

if TYPE_CHECKING:
    from .manager import TierManager
    from .store import Store

BACKGROUND_PAUSE_S = 1.0   # between two background passes (so an empty store does not spin)


@dataclass
class TierScrub:
    checked: int = 0
    corrupt: int = 0
    dropped: int = 0   # chunks that left the index because of this tier's damage (continuations included)
    bytes: int = 0


@dataclass
class ScrubReport:
    tiers: dict[str, TierScrub] = field(default_factory=dict)
    seconds: float = 0.0

    def tier(self, name: str) -> TierScrub:
        return self.tiers.setdefault(name, TierScrub())

    def as_dict(self) -> dict[str, Any]:
        totals = TierScrub()
        for t in self.tiers.values():
            for name in ("checked", "corrupt", "dropped", "bytes"):
                setattr(totals, name, getattr(totals, name) + getattr(t, name))
        return {"tiers": {k: asdict(v) for k, v in self.tiers.items()}, "seconds": round(self.seconds, 3),
                **asdict(totals)}


class Throttle:
    """Sleep so that ``rate`` bytes per second are not exceeded (0: no bound, but still yield to the loop)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.started = time.monotonic()
        self.done = 0

    async def took(self, nbytes: int) -> None:
        self.done += nbytes
        delay = self.done / self.rate - (time.monotonic() - self.started) if self.rate > 0 else 0.0
        await asyncio.sleep(max(0.0, delay))


class Scrubber:
    def __init__(self, store: "Store", integrity: Integrity, manager: "TierManager | None") -> None:
        self.store = store
        self.integrity = integrity
        self.manager = manager
        self.passes = 0
        self.running = 0
        self.last: ScrubReport | None = None
        self.totals = ScrubReport()

    async def scrub(self, rate: float = 0.0, quiet: bool = False) -> ScrubReport:
        """One pass over every tier (see the module docstring); ``quiet``: log the pass only if it found damage."""
        report = ScrubReport()
        for name in self._tiers():
            report.tier(name)
        started = time.monotonic()
        throttle = Throttle(rate)
        self.running += 1
        try:
            for entry in [e for e in self.store.index.values() if e.readable]:
                await throttle.took(await self._check(entry, report))
        finally:
            self.running -= 1
        report.seconds = time.monotonic() - started
        self._count(report, quiet)
        return report

    def _tiers(self) -> list[str]:
        tiers = ["host"]
        if self.store.disk is not None:
            tiers.append("disk")
        if self.store.gpu is not None:
            tiers.insert(0, "gpu")
        return tiers

    async def _check(self, entry: Entry, report: ScrubReport) -> int:
        """Check every copy of one chunk; returns the bytes read."""
        if entry.checksum is None or entry.key in self.integrity.pending:
            return 0
        read = 0
        if entry.gpu_offset is not None and self.store.gpu is not None and self._live(entry):
            bad = self._gpu_copy_bad(entry)
            read += self._tally(report, "gpu", entry, bad)
        if entry.host_offset is not None and self._live(entry):
            bad = await self.integrity.check_host([entry])
            read += self._tally(report, "host", entry, bool(bad) and self._live(entry))
        if entry.disk is DiskState.STORED and self.manager is not None and self._live(entry):
            bad = await self.manager.check_file(entry)
            if bad is not None and self._live(entry) and entry.disk is DiskState.STORED:
                read += self._tally(report, "disk", entry, bad)
        return read

    def _live(self, entry: Entry) -> bool:
        return entry.readable and self.store.index.get(entry.key) is entry

    def _gpu_copy_bad(self, entry: Entry) -> bool:
        assert self.store.gpu is not None and entry.gpu_offset is not None
        data = self.store.gpu.read(entry.gpu_offset, entry.size).cpu().numpy()
        return checksum(data) != entry.checksum

    def _tally(self, report: ScrubReport, tier: str, entry: Entry, bad: bool) -> int:
        t = report.tier(tier)
        t.checked += 1
        t.bytes += entry.size
        if bad:
            t.corrupt += 1
            t.dropped += self.integrity.report([entry], tier, "scrub")
        return entry.size

    def _count(self, report: ScrubReport, quiet: bool) -> None:
        self.passes += 1
        self.last = report
        for name, t in report.tiers.items():
            total = self.totals.tier(name)
            for field_name in ("checked", "corrupt", "dropped", "bytes"):
                setattr(total, field_name, getattr(total, field_name) + getattr(t, field_name))
        summary = report.as_dict()
        if quiet and not summary["corrupt"]:
            return
        log = logs.warning if summary["corrupt"] else logs.info
        log("scrub_done", checked=summary["checked"], corrupt=summary["corrupt"], dropped=summary["dropped"],
            seconds=summary["seconds"])

    async def run_background(self, rate: float) -> None:
        """Scrub pass after pass at ``rate`` bytes per second, until cancelled."""
        while True:
            try:
                await self.scrub(rate, quiet=True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug here must not stop the daemon
                logs.error("scrub_failed", error=repr(exc))
            await asyncio.sleep(BACKGROUND_PAUSE_S)

    def stats(self) -> dict[str, Any]:
        """Passes so far and, per tier, what they checked and found (every number is a metric)."""
        return {"passes": self.passes, "running": self.running,
                "tiers": {k: asdict(v) for k, v in self.totals.tiers.items()}}
