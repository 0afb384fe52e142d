"""Checksums from commit on: who takes them, where, and the checks that read host slots.

Every chunk gets one checksum, xxh3-64 of its bytes, and keeps it in every tier: it is the payload sum of its
disk file and of its remote record (``tiers/disk/format.py``, ``tiers/remote/record.py``), so it is computed once.

Where it is computed: by the daemon, on a worker thread right after commit (``after_commit``), not by the writer
while it copies. The daemon could not take a writer's sum on trust anyway (the point is to catch a client that
writes wrong bytes into the shared arena), so checking a claimed sum would cost the daemon the same pass as
computing it, and the writer's pass would come on top, on the engine's put path. xxh3 runs as fast as a memcpy
of the same bytes (``bench/verify.py`` measures both) and releases the GIL, so one worker keeps up with several
writers, and the event loop never hashes: a sustained put stream keeps nearly all of its speed, where hashing in
the writer would add a second pass over the bytes to its copy. The price is a window between commit and the sum
(the hash time of one chunk) in which a scribble would be summed as the chunk's bytes.

The chunk is readable at once; what waits for its sum is what carries the sum: the write-back to disk and the put
to the remote store start when it is known (``Puts.checksummed``), and a get that asks for verification waits
for it (``waits``). With a disk tier, summing is the first step of write-back: the slot is held as a slot being
written is (``Damage.begin_check``: not evicted, so a chunk is not lost between its commit and its write), and its
bytes count as waiting for write-back (``DiskLedger.dirty_bytes``), so puts feel the write-back's back-pressure from
commit on (``tiers/disk/mover.py``). Without one, the slot is not held: puts back to back must be able to evict the
previous put's chunks at once. Either way a chunk that left its slot while its sum was taken gets no sum from
that job: a hash of a reused slot is never kept. Re-checks (``check_host``) always hold the slot: a false alarm
there would drop a chunk.

``check_host`` re-hashes host slots (for a scrub, a client's report of a bad view, or before a copy to the GPU
tier) and hands copies that fail to the Store's damage path (``damage.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Sequence

import xxhash

from .. import logs
from .entry import Entry
from .store import Store

WORKERS = 1   # xxh3 outruns the copies that feed it; one thread per daemon leaves the cores to the engines


def checksum(data: memoryview | bytes) -> int:
    return xxhash.xxh3_64_intdigest(data)


def _sums(views: Sequence[memoryview]) -> list[int]:
    return [checksum(v) for v in views]


class Integrity:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.pool = concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="kvstore-sum")
        self.pending: dict[bytes, asyncio.Future] = {}   # key -> the job taking its sum
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.store.puts.sums = self

    # -- at commit ------------------------------------------------------------------------------------------
    def after_commit(self, entries: list[Entry]) -> None:
        """Take the sums of freshly committed chunks on the worker; then the Store sends them on."""
        entries = [e for e in entries if e.host_offset is not None]
        if not entries:
            return
        assert self._loop is not None
        views = [self.store.read(e) for e in entries]
        offsets = [e.host_offset for e in entries]
        self._count_waiting(entries, 1)
        if self.store.disk is not None:
            self.store.damage.begin_check(entries)
        fut = self._loop.run_in_executor(self.pool, _sums, views)
        done = self._loop.create_future()   # resolved once the sums are set (not merely computed)
        for entry in entries:
            self.pending[entry.key] = done
        fut.add_done_callback(lambda f: self._summed(entries, offsets, f, done))

    def _summed(self, entries: list[Entry], offsets: list[int | None], fut: asyncio.Future,
                done: asyncio.Future) -> None:
        try:
            self._take_sums(entries, offsets, fut)
        finally:
            for entry in entries:
                if self.pending.get(entry.key) is done:
                    del self.pending[entry.key]
            done.set_result(None)

    def _take_sums(self, entries: list[Entry], offsets: list[int | None], fut: asyncio.Future) -> None:
        self._count_waiting(entries, -1)
        if self.store.disk is not None:
            self.store.damage.end_check(entries)
        if fut.cancelled() or fut.exception() is not None:
            logs.error("checksum_failed", error=repr(None if fut.cancelled() else fut.exception()))
            return
        c = self.store.damage.counters
        summed = []
        for entry, offset, value in zip(entries, offsets, fut.result()):
            if entry.host_offset != offset or self.store.index.get(entry.key) is not entry:
                continue   # it left the slot while the hash read it: the value may be another chunk's bytes
            entry.learn_checksum(value)
            summed.append(entry)
            c.sums += 1
            c.sum_bytes += entry.size
        self.store.puts.checksummed(summed)

    def _count_waiting(self, entries: list[Entry], sign: int) -> None:
        disk = self.store.disk_ledger
        if disk is not None:
            disk.expect(sign * sum(e.size for e in entries))

    async def drain(self, deadline: float) -> bool:
        """At stop: wait until every sum being taken is set (write-back and remote puts start from it), or
        ``deadline`` (on ``time.monotonic``); True when none is left. A chunk whose sum was never set is never
        queued for the disk, so a stop that did not wait would lose it."""
        while self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.wait(set(self.pending.values()), timeout=left)
        return True

    def waits(self, keys: Sequence[bytes]) -> list[asyncio.Future]:
        """The sum jobs still running for any of ``keys``."""
        futures: list[asyncio.Future] = []
        for key in keys:
            fut = self.pending.get(key)
            if fut is not None and fut not in futures:
                futures.append(fut)
        return futures

    # -- checks ---------------------------------------------------------------------------------------------
    async def check_host(self, entries: Sequence[Entry]) -> list[Entry]:
        """Re-hash the host slots of ``entries`` (those with a slot and a sum); return the ones that failed."""
        chosen = [e for e in entries if e.host_offset is not None and e.checksum is not None and e.readable]
        if not chosen:
            return []
        assert self._loop is not None
        views = [self.store.read(e) for e in chosen]
        self.store.damage.begin_check(chosen)
        try:
            sums = await self._loop.run_in_executor(self.pool, _sums, views)
        finally:
            self.store.damage.end_check(chosen)
        return [e for e, value in zip(chosen, sums) if value != e.checksum]

    async def sum_slot(self, view: memoryview) -> int:
        """The checksum of ``view`` (a slot the caller holds), taken on the worker, never on the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, checksum, view)

    def report(self, bad: Sequence[Entry], tier: str, why: str) -> int:
        """Hand copies that failed to the damage path; returns the chunks dropped. One log line per report."""
        dropped = 0
        for entry in bad:
            dropped += self.store.damage.damaged(entry, tier)
        if bad:
            logs.warning("chunk_corrupt", tier=tier, found_by=why, chunks=len(bad), dropped=dropped,
                         namespace=bad[0].namespace, first=bad[0].key.hex())
        return dropped

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
