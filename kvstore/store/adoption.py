"""Warm restart: the next daemon on a socket adopts the DRAM tier its predecessor kept, verified before served.

A clean stop (SIGTERM, SIGINT, ``systemctl restart``, an upgrade) leaves the arena in ``/dev/shm`` and writes a
description beside it (``description.py``: which slot holds which chunk, with its namespace, parent, checksum and
engine names) after the Store's last change. The next daemon with the same socket:

1. reads and removes the description (``open_host_arena``); without one, after a crash, it replays the journal
   of committed slots the killed daemon kept beside the arena instead (``journal.py``: the committed chunks
   whose latest record is not a FREE). Without either (a first start, ``--no-adopt``, a record of another format
   version or of another socket) the old arena is freed and a fresh one made, and the ``arena_adoption`` log line
   says why;
2. maps the kept file at the configured ``--host-mem`` (a larger size grows it, a smaller one frees the pages
   past it), and takes the slots of the chunks that still fit (inside the tier, under ``--max-chunk``, not
   overlapping) before anything else is allocated (``HostTier.adopt``);
3. serves at once, while ``Adoption`` hashes the kept slots on a worker thread, a batch at a time, in the
   stopped daemon's eviction order: a chunk whose bytes match the checksum it was committed with is published
   (a disk copy of it gets the slot as its DRAM copy); one that does not is freed with every chunk that
   continues it, and counted as a scrub would count it. Until its batch is verified a chunk is a miss (or is
   served from its disk copy): nothing unverified is ever read by a client.

What never survives: reservations and half-written puts (never listed), put credits (a restarted daemon lends
anew, and clients forget theirs when they say hello again), leases (a chunk a reader held at the stop is kept
pinned for ``--lease-ttl`` after the restart, so its slot is not reused under a reader that has not noticed;
the reader's release then fails with LeaseError). A crash leaves no description, only the journal: the chunks
it proves are adopted the same way (verified first), everything else in the arena is free space, and no chunk
is held for a reader (the journal does not follow leases; see ``journal.py``).

Cost: one read of every kept byte by xxh3 (``bench/warm_restart.py`` measures it) on ``VERIFY_WORKERS`` threads,
off the event loop; the start itself only reads the description and builds the free list (O(chunks)).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import xxhash

from .. import logs
from ..mapped.arena import SharedArena, arena_path_for
from ..tiers.host.description import (ArenaDescription, DescriptionError, KeptChunk, description_path_for,
                          read_description, remove_description, write_description)
from ..tiers.host.journal import JournalError, SlotJournal, journal_path_for, read_journal, remove_journal
from ..tiers.host.tier import HostTier

if TYPE_CHECKING:
    from .store import Store

BATCH_BYTES = 64 << 20   # hashed per worker job: a batch is published as soon as it is verified
# Threads hashing kept batches at once (xxh3 releases the GIL): a restart may borrow a few cores for its
# seconds of verification, one per 8 of the host and at most 4, so that engines keep the rest.
VERIFY_WORKERS = max(1, min(4, (os.cpu_count() or 1) // 8))


@dataclass
class AdoptionReport:
    """What the start made of the arena its predecessor kept (the ``ready`` line, stats and /metrics)."""

    state: str = "none"        # none | off | refused | verifying | done
    reason: str = ""           # why nothing was adopted (state none, off or refused)
    source: str = ""           # what named the kept chunks: "description" (a clean stop) or "journal" (a crash)
    listed_chunks: int = 0     # chunks the description names
    listed_bytes: int = 0
    unfit_chunks: int = 0      # past the tier's size, over --max-chunk, or overlapping another
    verified_chunks: int = 0   # hashed and matched
    verified_bytes: int = 0
    adopted_chunks: int = 0    # published (verified, not a duplicate)
    adopted_bytes: int = 0
    corrupt_chunks: int = 0    # hashed and did not match: freed
    dropped_chunks: int = 0    # continuations of corrupt chunks, and duplicates of chunks put meanwhile
    seconds: float = 0.0       # from the start of verification to its end

    def fields(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class KeptArena:
    """The arena a start opened, and what it found in it (``chunks``: those whose slots it may take)."""

    arena: SharedArena
    chunks: list[KeptChunk]
    report: AdoptionReport


def open_host_arena(socket: str, size: int, chunk_limit: int, adopt: bool, reserve_all: bool) -> KeptArena:
    """The host tier's arena for the daemon on ``socket``: the kept one when its description allows, else a fresh
    one (the old file, if any, freed). Raises ConfigError as ``SharedArena.create`` / ``open_kept`` do."""
    path = arena_path_for(socket)
    desc_path, journal_path = description_path_for(path), journal_path_for(path)
    report = AdoptionReport()
    desc: ArenaDescription | None = None
    if not adopt:
        report.state, report.reason = "off", "--no-adopt"
    else:
        desc = _read_record(desc_path, journal_path, report)
    remove_description(desc_path)   # both describe the arena only until someone serves from it again
    remove_journal(journal_path)
    if desc is not None and (desc.socket != socket or desc.uid != os.getuid()):
        report.state, report.reason = "refused", f"the kept arena belongs to {desc.socket} (uid {desc.uid})"
        desc = None
    if desc is None:
        if report.state == "none":
            report.reason = ("the last daemon did not stop cleanly and left no journal of its arena"
                             if os.path.exists(path) else "no kept arena")
        return KeptArena(SharedArena.create(path, size, reserve_all), [], report)
    arena = SharedArena.open_kept(path, size, reserve_all)
    if arena is None:
        report.state, report.reason = "refused", "the description names an arena that is gone"
        return KeptArena(SharedArena.create(path, size, reserve_all), [], report)
    report.state = "verifying"
    report.listed_chunks, report.listed_bytes = len(desc.chunks), sum(c.size for c in desc.chunks)
    fit = [c for c in desc.chunks if c.size <= chunk_limit]
    report.unfit_chunks = len(desc.chunks) - len(fit)
    return KeptArena(arena, fit, report)


def _read_record(desc_path: str, journal_path: str, report: AdoptionReport) -> ArenaDescription | None:
    """What names the kept chunks: a clean stop's description, else a killed daemon's journal (None: neither,
    or one that cannot be used: ``report`` says why)."""
    try:
        desc = read_description(desc_path)
    except DescriptionError as exc:
        report.state, report.reason = "refused", str(exc)
        return None
    if desc is not None:
        report.source = "description"
        return desc
    try:
        replay = read_journal(journal_path)
    except JournalError as exc:
        report.state, report.reason = "refused", str(exc)
        return None
    if replay is None:
        return None
    report.source = "journal"
    logs.info("arena_journal", chunks=len(replay.chunks), records=replay.records, torn=replay.torn)
    return ArenaDescription(replay.socket, os.getuid(), 0, replay.chunks)


def open_journal(host: HostTier, socket: str) -> None:
    """Start the journal of ``host``'s committed slots (after its kept slots are taken); without one (it cannot
    be made) the daemon serves as well, and a crash adopts nothing."""
    try:
        host.journal = SlotJournal.create(journal_path_for(host.arena.path), socket)
    except OSError as exc:
        logs.error("journal_off", path=journal_path_for(host.arena.path), error=exc.strerror or repr(exc),
                   effect="a crash of this daemon adopts nothing from DRAM")


def take_kept_slots(host: HostTier, kept: KeptArena) -> None:
    """Take the slots of the kept chunks in ``host`` before anything else is allocated; those that do not fit
    are dropped from ``kept.chunks`` and counted."""
    taken = set(host.adopt([(c.offset, c.size) for c in kept.chunks]))
    fit = [c for c in kept.chunks if c.offset in taken]
    kept.report.unfit_chunks += len(kept.chunks) - len(fit)
    kept.chunks = fit
    if kept.report.state == "verifying" and not fit:
        kept.report.state = "done"


class Adoption:
    """Verifies a kept arena's chunks in the background and publishes those that match (see the module doc)."""

    def __init__(self, store: "Store", kept: KeptArena, hold_for: float) -> None:
        self.store = store
        self.report = kept.report
        self._waiting = list(kept.chunks)   # listed, slot taken, not verified yet (oldest first)
        self._dropped: set[str] = set()     # namespaces invalidated meanwhile: their chunks are freed, not adopted
        for chunk in self._waiting:   # known before anything is served: a client's hello is checked against them
            store.kept.learn_params(chunk.namespace, chunk.params)
        self._hold_for = hold_for
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin verifying on a worker thread (nothing to do when nothing was kept)."""
        if not self._waiting:
            return
        self._pool = concurrent.futures.ThreadPoolExecutor(VERIFY_WORKERS, thread_name_prefix="kvstore-adopt")
        self._task = loop.create_task(self._verify_all(loop))

    def holds(self, namespace: str) -> bool:
        """Whether a chunk of ``namespace`` still waits to be verified (it counts as held:
        ``server/requests/compat.py``)."""
        return namespace not in self._dropped and any(c.namespace == namespace for c in self._waiting)

    def drop_namespaces(self, namespaces: set[str]) -> int:
        """Chunks of ``namespaces`` still waiting are freed as they are settled instead of adopted (``kvstore
        invalidate``); returns how many were waiting."""
        self._dropped |= namespaces
        return sum(1 for c in self._waiting if c.namespace in namespaces)

    @property
    def waiting(self) -> list[KeptChunk]:
        """Kept chunks not verified yet: their slots are still taken, and a stop lists them again."""
        return [c for c in self._waiting if c.namespace not in self._dropped]

    async def _verify_all(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hash up to ``VERIFY_WORKERS`` batches at once, and settle them in order (oldest first), so that a
        corrupt chunk's continuations in later batches are found published and dropped as with one worker."""
        began = time.monotonic()
        assert self._pool is not None
        in_flight: collections.deque[tuple[int, asyncio.Future[list[int]]]] = collections.deque()
        submitted = 0   # chunks of ``_waiting`` handed to the workers (the first ones not settled yet)
        while self._waiting:
            while len(in_flight) < VERIFY_WORKERS and submitted < len(self._waiting):
                end = _batch_end(self._waiting, submitted)
                batch = self._waiting[submitted:end]
                views = [self.store.host.read(c.offset, c.size) for c in batch]
                in_flight.append((end - submitted, loop.run_in_executor(
                    self._pool, _hashes, views, [(c.offset, c.size) for c in batch], self.store.host.arena.populate)))
                submitted = end
            count, job = in_flight.popleft()
            sums = await job
            batch = self._waiting[:count]
            del self._waiting[:count]
            submitted -= count
            self._settle(batch, sums)
        self.report.seconds = round(time.monotonic() - began, 3)
        self.report.state = "done"
        logs.info("arena_adopted", **_summary(self.report))

    def _settle(self, batch: Sequence[KeptChunk], sums: Sequence[int]) -> None:
        if self._dropped:
            for chunk in batch:
                if chunk.namespace in self._dropped:
                    self.store.host.free(chunk.offset)
            kept = [(c, s) for c, s in zip(batch, sums) if c.namespace not in self._dropped]
            batch, sums = [c for c, _ in kept], [s for _, s in kept]
        good = [c for c, s in zip(batch, sums) if s == c.checksum]
        bad = [c for c, s in zip(batch, sums) if s != c.checksum]
        r = self.report
        r.verified_chunks += len(good)
        r.verified_bytes += sum(c.size for c in good)
        published, duplicates = self.store.kept.adopt(good, self._hold_for)
        r.adopted_chunks += len(published)
        r.adopted_bytes += sum(e.size for e in published)
        r.dropped_chunks += duplicates
        if bad:
            r.corrupt_chunks += len(bad)
            self.store.damage.counters.corrupt_host += len(bad)
            r.dropped_chunks += self.store.kept.drop_unverified(bad)
            logs.warning("kept_chunk_corrupt", chunks=len(bad), first=bad[0].key.hex(), namespace=bad[0].namespace)

    def close(self) -> None:
        """Stop verifying (at stop: what is left stays listed in ``waiting``)."""
        if self._task is not None:
            self._task.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def describe(store: "Store", waiting: Sequence[KeptChunk], socket: str) -> ArenaDescription:
    """The description of ``store``'s DRAM chunks as they are now (plus kept chunks not verified yet), oldest in
    the eviction order first. A chunk whose checksum is not taken yet is hashed now."""
    from .kept import kept_chunk

    queued = list(store.lru)
    seen = {id(e) for e in queued}
    others = [e for e in store.index.values() if id(e) not in seen]
    chunks = list(waiting)
    for entry in queued + others:
        if not entry.readable or entry.host_offset is None or entry.loading is not None:
            continue
        checksum = entry.checksum
        if checksum is None:
            checksum = xxhash.xxh3_64_intdigest(store.host.read(entry.host_offset, entry.size))
        params = store.key_params.get(entry.namespace)
        chunks.append(kept_chunk(entry, checksum, leased=entry.pins > 0, params=params))
    return ArenaDescription(socket, os.getuid(), store.host.arena.size, chunks)


def keep_arena(store: "Store", waiting: Sequence[KeptChunk], socket: str) -> int:
    """Write the description of the arena for the next daemon; returns the chunks listed."""
    desc = describe(store, waiting, socket)
    write_description(description_path_for(store.host.arena.path), desc)
    logs.info("arena_kept", chunks=len(desc.chunks), bytes=sum(c.size for c in desc.chunks),
              path=store.host.arena.path)
    return len(desc.chunks)


def _batch_end(waiting: list[KeptChunk], start: int) -> int:
    """The end of the batch of ``waiting`` that starts at ``start``: at least one chunk, at most BATCH_BYTES."""
    total, end = 0, start
    while end < len(waiting) and (end == start or total + waiting[end].size <= BATCH_BYTES):
        total += waiting[end].size
        end += 1
    return end


def _hashes(views: Sequence[memoryview], extents: Sequence[tuple[int, int]] = (),
            populate: Callable[[int, int], None] | None = None) -> list[int]:
    """The xxh3 of each view; ``populate`` maps each extent's pages first (a kept arena is mapped afresh: one
    call per chunk costs less than a fault per page)."""
    if populate is not None:
        for offset, size in extents:
            populate(offset, size)
    return [xxhash.xxh3_64_intdigest(v) for v in views]


def _summary(report: AdoptionReport) -> dict[str, Any]:
    return {k: v for k, v in report.fields().items() if k != "reason" or v}
