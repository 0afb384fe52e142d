"""Scrub: one pass over every tier, checking every copy of every chunk against the chunk's checksum.

A pass takes a snapshot of the index and, chunk by chunk, re-hashes the host slot (on the checksummer's worker,
the slot held while it reads), reads and checks the disk file (on the disk mover's pool, into a scratch
buffer: the host copy is not touched) and copies the GPU copy to host memory and hashes it (the copy runs on the
event loop, so the slot cannot be freed under it; a GPU tier is small next to DRAM). A copy that fails goes to
the Store's damage path: repaired from an intact copy in another tier, or dropped with its continuations. Chunks
whose sum is still being taken, and chunks that moved or went while the pass reached them, are skipped, not
counted. The remote store is shared by many daemons and checked on every fetch; a pass does not walk it.

Rate. ``rate`` bounds the bytes checked per second (0: as fast as the worker goes): after each chunk the pass
sleeps until its bytes fit the budget, so a background scrub (``--scrub-rate``) costs a known share of memory
bandwidth and one worker thread, and never holds the event loop longer than one chunk's bookkeeping.

Progress and stopping. A pass may be given a ``ScrubProgress``, which it keeps up to date (what it planned to
check, what it has checked) and whose ``stop`` it honours between two chunks, also while it sleeps for its rate:
a stopped pass ends at once with the counts so far and ``cancelled`` set. Stopping is cooperative rather than a
task cancellation so that a chunk being checked (a host slot held by the hashing worker, a file being read) is
always finished and released first.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .. import logs
from ..tiers.disk.mover import FileCheck
from .entry import DiskState, Entry
from .integrity import Integrity, checksum

if TYPE_CHECKING:
    from ..tiers.disk.mover import DiskMover
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
    cancelled: bool = False   # stopped before it reached every chunk: the counts cover what it checked

    def tier(self, name: str) -> TierScrub:
        return self.tiers.setdefault(name, TierScrub())

    def as_dict(self) -> dict[str, Any]:
        totals = TierScrub()
        for t in self.tiers.values():
            for name in ("checked", "corrupt", "dropped", "bytes"):
                setattr(totals, name, getattr(totals, name) + getattr(t, name))
        return {"tiers": {k: asdict(v) for k, v in self.tiers.items()}, "seconds": round(self.seconds, 3),
                "cancelled": self.cancelled, **asdict(totals)}


@dataclass
class ScrubProgress:
    """How far one pass has got; ``stop`` ends it between two chunks (see the module docstring)."""

    chunks_total: int = 0     # chunks in the pass's snapshot of the index
    bytes_total: int = 0      # bytes of their copies (a chunk in two tiers counts twice): what a full pass reads
    chunks_done: int = 0
    bytes_done: int = 0
    started: float = field(default_factory=time.monotonic)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def plan(self, entries: list[Entry]) -> None:
        self.chunks_total = len(entries)
        self.bytes_total = sum(e.size * _copies(e) for e in entries)

    def advance(self, nbytes: int) -> None:
        self.chunks_done += 1
        self.bytes_done += nbytes

    def as_dict(self) -> dict[str, Any]:
        """The figures a progress line shows: done and planned, the rate so far and the time left at that rate."""
        seconds = time.monotonic() - self.started
        rate = self.bytes_done / seconds if seconds > 0 else 0.0
        left = max(0, self.bytes_total - self.bytes_done)
        return {"chunks_done": self.chunks_done, "chunks_total": self.chunks_total, "bytes_done": self.bytes_done,
                "bytes_total": self.bytes_total, "seconds": round(seconds, 3), "rate": round(rate, 1),
                "eta_s": round(left / rate, 1) if rate > 0 else None}


def _copies(entry: Entry) -> int:
    return (entry.gpu_offset is not None) + (entry.host_offset is not None) + (entry.disk is DiskState.STORED)


class Throttle:
    """Sleep so that ``rate`` bytes per second are not exceeded (0: no bound, but still yield to the loop)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.started = time.monotonic()
        self.done = 0

    async def took(self, nbytes: int, stop: asyncio.Event | None = None) -> None:
        """Wait until ``nbytes`` more fit the rate, or until ``stop`` is set."""
        self.done += nbytes
        delay = self.done / self.rate - (time.monotonic() - self.started) if self.rate > 0 else 0.0
        if stop is None or delay <= 0:
            await asyncio.sleep(max(0.0, delay))
            return
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except asyncio.TimeoutError:
            pass


class Scrubber:
    def __init__(self, store: "Store", integrity: Integrity, disk_mover: "DiskMover | None") -> None:
        self.store = store
        self.integrity = integrity
        self.disk_mover = disk_mover
        self.passes = 0
        self.running = 0
        self.last: ScrubReport | None = None
        self.totals = ScrubReport()
        for name in self._tiers():
            self.totals.tier(name)   # every tier's counts exist, at zero, before the first pass

    def snapshot(self) -> list[Entry]:
        """The chunks a pass starting now checks."""
        return [e for e in self.store.index.values() if e.readable]

    async def scrub(self, rate: float = 0.0, quiet: bool = False, progress: ScrubProgress | None = None,
                    entries: list[Entry] | None = None) -> ScrubReport:
        """One pass over every tier (see the module docstring); ``quiet``: log the pass only if it found damage.
        ``progress`` is kept up to date, and its ``stop`` ends the pass early (the report says ``cancelled``);
        ``entries``: the ``snapshot`` to check (default: one taken now)."""
        report = ScrubReport()
        for name in self._tiers():
            report.tier(name)
        started = time.monotonic()
        throttle = Throttle(rate)
        progress = progress or ScrubProgress()
        entries = self.snapshot() if entries is None else entries
        progress.plan(entries)
        self.running += 1
        try:
            for entry in entries:
                if progress.stop.is_set():
                    report.cancelled = True
                    break
                read = await self._check(entry, report)
                progress.advance(read)
                await throttle.took(read, progress.stop)
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
            read += self._tally(report, "gpu", entry, self._gpu_copy_bad(entry))
        if entry.host_offset is not None and self._live(entry):
            failed = await self.integrity.check_host([entry])
            read += self._tally(report, "host", entry, bool(failed) and self._live(entry))
        if entry.disk is DiskState.STORED and self.disk_mover is not None and self._live(entry):
            found = await self.disk_mover.check_file(entry)
            if found is FileCheck.UNREADABLE:
                self.store.tier_counters.io_errors += 1
            elif found is not FileCheck.GONE and self._live(entry) and entry.disk is DiskState.STORED:
                read += self._tally(report, "disk", entry, found is FileCheck.DAMAGED)
        return read

    def _live(self, entry: Entry) -> bool:
        return entry.readable and self.store.index.get(entry.key) is entry

    def _gpu_copy_bad(self, entry: Entry) -> bool:
        assert self.store.gpu is not None and entry.gpu_offset is not None
        data = self.store.gpu.read(entry.gpu_offset, entry.size).cpu().numpy()
        return checksum(data.data) != entry.checksum

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
        log("scrub_cancelled" if report.cancelled else "scrub_done", checked=summary["checked"],
            corrupt=summary["corrupt"], dropped=summary["dropped"], seconds=summary["seconds"])

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
