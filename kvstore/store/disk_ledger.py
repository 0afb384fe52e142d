"""The disk tier's ledger: the ``Store`` methods that keep ``Entry.disk``, ``Entry.disk_bytes``, the disk LRU and
the write-back queue (``dirty``), and the host watermark that demotes DRAM copies of chunks already on disk.

The tier manager (``manager.py``) does the I/O and reports back through ``next_write``/``finish_write`` and
``start_promote``/``finish_promote``; everything here runs on the event loop, like the rest of the Store. It is
a mixin of ``Store`` (as ``damage.py`` is) so that allocation, freeing and pins stay in one object: the Store is
still the only code that allocates, frees and pins, and this file the only one that charges the disk tier.
"""

from __future__ import annotations

import errno
from typing import Sequence

from ..errors import ChecksumError, DamagedSource, FormatError, StoreFullError
from .entry import DiskState, Entry, State
from .room import make_room, shed_to_low

HOST_HIGH_WATERMARK = 0.95
HOST_LOW_WATERMARK = 0.85


class DiskLedger:
    """Methods of ``Store`` for the disk tier (see the module docstring)."""

    def rebalance(self) -> int:
        """Above the high watermark, drop DRAM copies of chunks already on disk (LRU first) until under the low
        one. Stops at a chunk not yet on disk: that is for the write-back to fix, not for demotion to lose."""
        if self.disk is None:
            return 0
        host = self.host
        return shed_to_low(lambda: host.used_bytes > HOST_HIGH_WATERMARK * host.capacity_bytes,
                           lambda: host.used_bytes > HOST_LOW_WATERMARK * host.capacity_bytes,
                           self._next_demotable, self._demote_host_copy)

    def _next_demotable(self) -> Entry | None:
        """The oldest DRAM chunk, if its DRAM copy can go now without losing it (it is on disk)."""
        victim = self.lru.peek_oldest()
        if victim is None or victim.disk is not DiskState.STORED or victim.gpu_loading is not None \
                or victim.checking:
            return None
        return victim

    def _demote_host_copy(self, entry: Entry) -> bool:
        self.lru.pop_oldest()
        self._drop_host_copy(entry)
        return True

    def adopt(self, key: bytes, size: int, namespace: str, footprint: int, checksum: int | None = None,
              parent: bytes | None = None) -> bool:
        """Index a chunk found on disk at start (call oldest first). False when it does not fit the cap."""
        assert self.disk is not None
        if key in self.index or not self._charge_disk(footprint):
            return False
        entry = Entry(key, size, namespace, parent, State.COMMITTED, disk=DiskState.STORED, disk_bytes=footprint,
                      checksum=checksum)
        self.index[key] = entry
        self.disk_lru.add_newest(entry)
        self._sync(key)
        return True

    def next_write(self) -> Entry | None:
        """Take the next queued chunk for writing, with its disk space charged; None when the queue is empty."""
        assert self.disk is not None
        while self.dirty:
            entry = self.dirty.popleft()
            self.dirty_bytes -= entry.size
            if entry.disk is not DiskState.QUEUED or self.index.get(entry.key) is not entry \
                    or entry.host_offset is None:
                continue  # deleted or evicted while queued
            footprint = self.disk.footprint(entry.size)
            if not self._charge_disk(footprint):
                self._forget_disk(entry)
                self.tier_counters.disk_write_skipped += 1
                continue
            entry.disk = DiskState.WRITING
            entry.disk_bytes = footprint
            self.dirty_bytes += entry.size
            return entry
        return None

    def finish_write(self, entry: Entry, stored: int | None, error: BaseException | None) -> None:
        """A write ended: ``stored`` payload bytes, or ``error``."""
        assert self.disk is not None
        self.dirty_bytes -= entry.size
        tc = self.tier_counters
        if error is not None:
            damaged = isinstance(error, DamagedSource)   # the slot failed its check: nothing was written
            tc.io_errors += not damaged
            tc.disk_write_skipped += 1
            if getattr(error, "errno", None) == errno.ENOSPC:
                self.disk_full_reason = (f"disk tier is full: the filesystem of {self.disk.directory} has no space "
                                         f"left for a {entry.size}-byte chunk; free space there or lower --disk-size")
                self.disk_full_need = 2 * entry.disk_bytes
            entry.disk = DiskState.NONE
            self.disk.uncharge(entry.disk_bytes)
            entry.disk_bytes = 0
            self.disk_lru.remove(entry)
            if entry.doomed:
                self._release_if_idle(entry)
            elif damaged:
                self.damaged(entry, "host")
            return
        assert stored is not None
        entry.disk = DiskState.STORED
        actual = self.disk.footprint(stored)
        self.disk.used_bytes -= entry.disk_bytes - actual
        entry.disk_bytes = actual
        tc.disk_writes += 1
        tc.disk_write_bytes += stored
        self.disk_full_reason = ""
        if entry.doomed:
            self._release_if_idle(entry)

    def start_promote(self, entry: Entry) -> int | None:
        """Give a disk-only chunk a host slot to be read into; None if it is not promotable or DRAM is full."""
        if entry.host_offset is not None or entry.gpu_offset is not None or entry.loading is not None \
                or entry.disk is not DiskState.STORED or not entry.readable:
            return None
        try:
            offset = self._allocate(entry.size)
        except StoreFullError:
            return None
        entry.loading = offset
        self.disk_lru.remove(entry)
        return offset

    def finish_promote(self, entry: Entry, error: BaseException | None, checksum: int | None = None) -> bool:
        """A promotion read ended (``checksum``: the one the file holds, checked against the bytes read). On error
        the chunk is a miss from now on: a bad file is quarantined and the chunk dropped with its continuations."""
        offset, entry.loading = entry.loading, None
        tc = self.tier_counters
        if error is None and not entry.doomed:
            if entry.checksum is None:
                entry.checksum = checksum
            entry.host_offset = offset
            self._sync(entry.key)
            self.lru.add_chain([entry])
            self.disk_lru.add_chain([entry])
            tc.promotions_disk_host += 1
            tc.promoted_bytes_disk_host += entry.size
            tc.disk_reads += 1
            tc.disk_read_bytes += entry.size
            return True
        self.host.free(offset)
        if error is not None:
            bad = isinstance(error, (ChecksumError, FormatError))
            if bad:
                tc.checksum_failures += 1
            else:
                tc.io_errors += 1
            if bad and not entry.doomed:
                self.damaged(entry, "disk")
            if not entry.doomed:
                del self.index[entry.key]
                self.lru.remove(entry)
            self._drop_disk_copy(entry, quarantine=str(error) if bad else None)
            entry.doomed = True
            self._sync(entry.key)
        self._release_if_idle(entry)
        return False

    def to_promote(self, keys: Sequence[bytes]) -> list[Entry]:
        """The disk-only chunks of the longest stored prefix of ``keys``, cut where the prefix would pass half the
        host tier: promoting more would evict the prefix's own first chunks to make room for its last ones."""
        budget = self.host.capacity_bytes // 2
        chosen = []
        for entry in self.leading(keys):
            budget -= entry.size
            if budget < 0:
                break
            if entry.host_offset is None and entry.gpu_offset is None:
                chosen.append(entry)
        return chosen

    def _queue_writes(self, entries: list[Entry]) -> None:
        """Queue newly committed chunks for write-back to the disk tier (commit order: prefixes first)."""
        if self.disk is None or not entries:
            return
        for entry in entries:
            entry.disk = DiskState.QUEUED
            self.dirty.append(entry)
            self.dirty_bytes += entry.size
        self.disk_lru.add_chain(entries)
        if self.io is not None:
            self.io.wake_writer()

    def _charge_disk(self, footprint: int) -> bool:
        """Make room on disk (evicting its LRU chunks) and charge ``footprint`` bytes; False if impossible. Chunks
        queued or being written are not evictable from disk yet."""
        assert self.disk is not None
        if footprint > self.disk.capacity_bytes:
            return False
        disk = self.disk
        return make_room(lambda: True if disk.charge(footprint) else None, self.disk_lru,
                         lambda e: e.disk is DiskState.STORED, self._evict_from_disk) is not None

    def _evict_from_disk(self, entry: Entry) -> None:
        """A chunk leaves the disk tier (already out of the disk LRU); it is lost unless still in DRAM."""
        self.tier_counters.evictions_disk += 1
        self.tier_counters.evicted_bytes_disk += entry.size
        self._drop_disk_copy(entry)
        if entry.host_offset is None and entry.gpu_offset is None and entry.loading is None and not entry.doomed:
            del self.index[entry.key]
            self._sync(entry.key)
            self.lru.remove(entry)
            self.counters.evictions += 1
            self.counters.evicted_bytes += entry.size

    def _drop_disk_copy(self, entry: Entry, quarantine: str | None = None) -> None:
        if entry.disk is DiskState.STORED and self.disk is not None:
            self.disk.uncharge(entry.disk_bytes)
            entry.disk_bytes = 0
            entry.disk = DiskState.NONE
            if self.io is not None:
                self.io.remove_file(entry.key, quarantine)
            if quarantine is not None:
                self.tier_counters.quarantined += 1

    def _forget_disk(self, entry: Entry) -> None:
        """The chunk will not (or no longer) be on disk: drop a stored copy; a queued one is skipped later."""
        if entry.disk is DiskState.STORED:
            self._drop_disk_copy(entry)
        elif entry.disk is DiskState.QUEUED:
            entry.disk = DiskState.NONE
        if entry.disk is DiskState.NONE:
            self.disk_lru.remove(entry)
