"""The disk mover: write-back to disk, promotion from disk, and back-pressure, around the Store.

Write-back, not write-through. A commit makes a chunk readable from DRAM at once and queues it (``DiskLedger.dirty``,
commit order, so a chain's prefix reaches disk before its continuations); up to ``io_depth`` workers write
queued chunks straight from their host slots. A put therefore costs DRAM bandwidth, not disk bandwidth, and a
chunk that is deleted or evicted before its turn is never written at all. The price is the window between
commit and the end of the write: ``kill -9`` (or a crash) loses the chunks still queued, which is acceptable for
a cache — a lost chunk is a miss, never wrong data. SIGTERM flushes the queue (``drain``, bounded by the stop budget's
disk step, ``server/lifecycle/stopping.py``).

Back-pressure. The queue holds references, never copies: a queued chunk's bytes are its DRAM slot. So memory
cannot grow past the host tier, but a put faster than the disk would fill DRAM with chunks that cannot yet be
demoted, and the next allocation would have to evict unwritten chunks. To prevent that, the bytes queued or in
flight are bounded (``--disk-queue``): a put that would pass the bound waits (asynchronously, up to its
``wait_ms``) for the writers to drain it, and fails with StoreFullError ("disk writes are behind") if they do
not. Puts thus slow down to disk speed under sustained load instead of dropping data or growing memory.

Promotion. A lookup that finds leading chunks only on disk starts reading them into newly allocated host slots
right away (the Store allocates; a worker reads with O_DIRECT into the slot and checks the checksum), so a get
shortly after finds them in DRAM; a get of disk-only chunks awaits those reads, bounded by its ``wait_ms``. A
read that fails its checksum makes the chunk a miss (its file is quarantined) and is counted, never served.

Checksums. A write checks the slot against the checksum the chunk got at commit (``integrity.py``) and stores
that same sum in the file's header; a slot that fails is not written and the chunk goes through the Store's
damage path (``damage.py``). A read returns the file's sum, which must also be the chunk's own.

Demotion. Chunks whose write has completed can leave DRAM for free (the file is there), so demotion is just a
free: ``DiskLedger.rebalance`` runs after every completed write and on each sweep and keeps the host tier between its
watermarks, oldest (continuations first) first.

Shape: the disk mover is the disk tier's mover (``mover_life.py``: start, wake, drain, close, stats); it talks only
to the disk ledger (``store/ledgers/disk.py``), which wakes it when a commit queued writes, and only through
``DiskBooks`` (``tiers/ledger_api.py``): the ledger hands it each write (``DiskWrite``: the chunk, its slot, what its
header records) and hears how each transfer ended. Back-pressure and the flush wait on the mover's condition
(``wait_until``), notified by every write that ends. A scrub's check of a file returns what it found
(``FileCheck``); the caller counts it.

File removals go to the same worker pool; a later write of the same key waits for an earlier removal, so a
delete followed by a put of the same key never loses the new file to the old unlink.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import errno
import functools
import shutil
import time
from typing import Generic, Sequence

from ... import logs
from ...errors import ChecksumError, FormatError
from ..host.tier import HostTier
from ..ledger_api import C, DiskBooks, DiskWrite
from ..mover_life import MoverLife
from .tier import DiskTier, round_up


class FileCheck(enum.Enum):
    """What a scrub's read of a chunk's file found."""

    INTACT = "intact"
    DAMAGED = "damaged"         # the bytes or the header fail their checksum, or differ from the chunk's own
    GONE = "gone"               # no file (removed meanwhile): nothing to count
    UNREADABLE = "unreadable"   # an I/O error: counted as such by the caller, not as damage


class DiskMover(MoverLife, Generic[C]):
    def __init__(self, ledger: DiskBooks[C], disk: DiskTier, host: HostTier, io_depth: int,
                 queue_bytes: int) -> None:
        """The mover of ``disk`` for ``ledger``, writing from and reading into slots of ``host``.

        Args:
            io_depth: writes in flight at once (the worker pool is twice as large: reads always find a worker).
            queue_bytes: the write-back bound (bytes queued or in flight) past which puts wait.
        """
        super().__init__()
        self.ledger = ledger
        self.disk = disk
        self.host = host
        self.io_depth = io_depth
        self.read_ns = 0       # time the promotion reads took, and the bytes they read
        self.read_bytes = 0
        self.queue_bytes = queue_bytes
        # Twice the write depth, so that promotion reads always find a worker while writes are in flight.
        self.pool = concurrent.futures.ThreadPoolExecutor(2 * io_depth, thread_name_prefix="kvstore-io")
        self.writing = 0
        self._removing: dict[bytes, concurrent.futures.Future] = {}
        ledger.mover = self

    # -- write-back -----------------------------------------------------------------------------------------
    def wake(self) -> None:
        """Start writes for what the ledger queued, up to ``io_depth`` at once."""
        if self._loop is None:
            return
        while self.writing < self.io_depth:
            write = self.ledger.next_write()
            if write is None:
                break
            self.writing += 1
            chunk = write.chunk
            slot = self.host.read(write.host_offset, round_up(chunk.size))
            before = self._removing.get(chunk.key)
            fut = self._loop.run_in_executor(self.pool, self._write_job, write, slot, before)
            fut.add_done_callback(functools.partial(self._write_done, chunk))

    def _write_job(self, write: DiskWrite[C], slot: memoryview, before: concurrent.futures.Future | None) -> int:
        if before is not None:
            before.result()
        chunk = write.chunk
        return self.disk.write(chunk.key, chunk.namespace, slot, chunk.size, chunk.checksum, write.parent,
                               write.engine, write.retention, write.params)

    def _write_done(self, entry: C, fut: asyncio.Future) -> None:
        self.writing -= 1
        error = fut.exception()
        was_full = bool(self.ledger.full_reason)
        if error is not None and not (was_full and getattr(error, "errno", None) == errno.ENOSPC):
            logs.warning("disk_write_failed", key=entry.key.hex(), error=repr(error))
        self.ledger.finish_write(entry, None if error else fut.result(), error)
        if self.ledger.full_reason and not was_full:
            logs.warning("disk_full", directory=self.disk.directory, reason=self.ledger.full_reason)
        self.wake()
        self.ledger.rebalance()
        self.changed()

    def queued_bytes(self) -> int:
        """Bytes committed and waiting for (or being written to) the disk."""
        return self.ledger.dirty_bytes

    def over_bound(self, nbytes: int) -> bool:
        """Whether queuing ``nbytes`` more would pass the write-back bound (a lone large put always passes)."""
        return self.ledger.over_bound(nbytes, self.queue_bytes)

    async def wait_for_room(self, nbytes: int, timeout: float) -> bool:
        return await self.wait_until(lambda: not self.over_bound(nbytes), time.monotonic() + timeout)

    def idle(self) -> bool:
        """Nothing queued or being written (at stop: everything committed is on disk)."""
        return not self.ledger.dirty and not self.writing

    # -- promotion ------------------------------------------------------------------------------------------
    def promote(self, entries: Sequence[C]) -> list[asyncio.Future]:
        """Start reading disk-only chunks into DRAM; returns the reads in flight for them."""
        futures: list[asyncio.Future] = []
        if self._loop is None:
            return futures
        for entry in entries:
            fut = self.in_flight.get(entry.key)
            if fut is None:
                offset = self.ledger.start_promote(entry)
                if offset is None:
                    break  # DRAM full of pinned chunks, or not promotable: the rest would not be a prefix
                slot = self.host.read(offset, round_up(entry.size))
                before = self._removing.get(entry.key)
                fut = self._loop.run_in_executor(self.pool, self._read_job, entry, slot, before)
                fut.add_done_callback(functools.partial(self._read_done, entry))
                self.in_flight[entry.key] = fut
            futures.append(fut)
        return futures

    def _read_job(self, entry: C, slot: memoryview,
                  before: concurrent.futures.Future | None) -> tuple[int | None, int]:
        """Read and check one chunk; returns the file's sum and the nanoseconds the read took."""
        if before is not None:
            before.result()
        started = time.perf_counter_ns()
        got = self.disk.read_into(entry.key, slot, entry.size)
        took = time.perf_counter_ns() - started
        if got is not None and entry.checksum is not None and got != entry.checksum:
            raise ChecksumError(f"file of chunk {entry.key.hex()} holds other bytes than were committed")
        return got, took

    def _read_done(self, entry: C, fut: asyncio.Future) -> None:
        self.in_flight.pop(entry.key, None)
        error = fut.exception()
        if error is not None:
            logs.warning("disk_read_failed", key=entry.key.hex(), error=repr(error))
            self.ledger.finish_promote(entry, error, None)
        else:
            got, took = fut.result()
            self.read_ns += took   # the fetch cost this tier measures (stats: read_ns_per_kib)
            self.read_bytes += entry.size
            self.ledger.finish_promote(entry, None, got)
        self.changed()

    async def check_file(self, entry: C) -> FileCheck:
        """Read and check the chunk's file (a scrub) against its checksum.

        Returns:
            What the read found: damage, an intact file, no file, or an I/O error (logged here; the caller
            counts it).
        """
        assert self._loop is not None
        before = self._removing.get(entry.key)
        try:
            got = await self._loop.run_in_executor(self.pool, self._verify_job, entry.key, entry.size, before)
        except (ChecksumError, FormatError):
            return FileCheck.DAMAGED
        except FileNotFoundError:
            return FileCheck.GONE
        except OSError as exc:
            logs.warning("disk_read_failed", key=entry.key.hex(), error=repr(exc))
            return FileCheck.UNREADABLE
        return FileCheck.DAMAGED if entry.checksum is not None and got != entry.checksum else FileCheck.INTACT

    def _verify_job(self, key: bytes, size: int, before: concurrent.futures.Future | None) -> int:
        if before is not None:
            before.result()
        return self.disk.verify(key, size)

    # -- removal --------------------------------------------------------------------------------------------
    def remove_file(self, key: bytes, quarantine: str | None = None) -> None:
        before = self._removing.get(key)
        fut = self.pool.submit(self._remove_job, key, quarantine, before)
        self._removing[key] = fut
        if self._loop is not None:
            fut.add_done_callback(lambda f: self.call_soon(self._removed, key, f))

    def _remove_job(self, key: bytes, quarantine: str | None, before: concurrent.futures.Future | None) -> None:
        if before is not None:
            before.result()
        if quarantine is None:
            self.disk.remove(key)
        else:
            self.disk.quarantine(key, quarantine)

    def _removed(self, key: bytes, fut: concurrent.futures.Future) -> None:
        if self._removing.get(key) is fut:
            del self._removing[key]
        if fut.exception() is not None:
            logs.warning("disk_remove_failed", key=key.hex(), error=repr(fut.exception()))

    # -- upkeep ---------------------------------------------------------------------------------------------
    def check_space(self) -> None:
        """Clear the 'disk full' state once the filesystem has room again."""
        if self.ledger.full_reason and self.ledger.space_back(shutil.disk_usage(self.disk.directory).free):
            logs.info("disk_space_back", directory=self.disk.directory)

    def stats(self) -> dict[str, int]:
        """The queues, and the measured fetch cost: nanoseconds per KiB read back (0 before the first read),
        what a router can weigh a disk hit by beside the events (``docs/operations/events.md``)."""
        return {"write_queue_chunks": len(self.ledger.dirty), "write_queue_bytes": self.ledger.dirty_bytes,
                "writes_in_flight": self.writing, "reads_in_flight": len(self.in_flight),
                "read_ns_per_kib": self.read_ns * 1024 // self.read_bytes if self.read_bytes else 0}

    def close(self) -> None:
        self.pool.shutdown(wait=True)
