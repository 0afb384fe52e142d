"""The disk tier's ledger: the only code that changes ``Entry.disk`` and ``Entry.disk_bytes``, and keeps the disk
LRU, the write-back queue (``dirty``), the disk tier's charge and the "disk full" state.

Its mover is the disk mover (``tiers/disk/mover.py``; ``sim/movers.py`` in the simulator): the ledger queues a commit's
chunks for write-back and wakes the mover, which takes them one by one (``next_write``: disk space is charged
here, evicting the disk LRU's oldest files), writes them and reports back (``finish_write``); a promotion gets
its DRAM slot from ``start_promote`` and ends in ``finish_promote``. Files the ledger drops are removed by the
mover (``remove_file``), in order with its writes. Everything here runs on the event loop. The Store reaches
this ledger only through the hooks of ``base.py``; the host watermark (``rebalance``) is here because it only
ever drops DRAM copies of chunks already on disk.
"""

from __future__ import annotations

import errno
from collections import deque
from typing import TYPE_CHECKING, Protocol, Sequence

from ...errors import ChecksumError, DamagedSource, FormatError, StoreFullError
from ...protocol.engine_blocks import EngineBlocks
from ...protocol.retention import Retention
from ...tiers.disk.tier import DiskTier
from ...tiers.ledger_api import DiskMoverHooks, DiskWrite
from ..entry import DiskState, Entry, State
from .base import DamagePath, FillStore, TierLedger
from ..policies import make_queue
from ..retention import stored_class
from ..room import make_room, shed_to_low
from ..tier_guard import TierGuard

if TYPE_CHECKING:
    from ...protocol.key_params import KeyParams
    from ..classes import RetentionClasses
    from ..eviction import EvictionQueue

HOST_HIGH_WATERMARK = 0.95
HOST_LOW_WATERMARK = 0.85


class DiskStore(FillStore, Protocol):
    """What the disk ledger asks of the Store beyond every ledger's (``base.LedgerStore``): the DRAM queue its
    watermark drains, the way a DRAM copy leaves, the chunk's way out of the index, key parameters for file
    headers, and the damage path."""

    @property
    def lru(self) -> EvictionQueue: ...
    @property
    def key_params(self) -> dict[str, KeyParams]: ...
    @property
    def damage(self) -> DamagePath: ...
    @property
    def retention(self) -> RetentionClasses: ...   # split into class queues when a file keeps a class

    def drop_host_copy(self, entry: Entry) -> None: ...
    def unindex(self, entry: Entry) -> None: ...
    def lost(self, entry: Entry) -> None: ...


class DiskLedger(TierLedger):
    name = "disk"

    def __init__(self, store: DiskStore, disk: DiskTier, policy: str) -> None:
        """The books of ``disk`` for ``store`` (which builds this ledger: ``builder.py``), its files evicted in the
        order of ``policy`` (``store/policies.py``)."""
        self.store = store
        self.disk = disk
        self.lru = make_queue(policy)
        self.dirty: deque[Entry] = deque()   # write-back queue, commit order (prefixes first)
        self.dirty_bytes = 0                 # bytes queued, being checksummed or being written
        self.full_reason = ""                # set when the filesystem said ENOSPC, until it has room again
        self.full_need = 0                   # free bytes that clear it (checked by the mover)
        self.mover: DiskMoverHooks | None = None
        self.guard: TierGuard | None = None  # each tenant's disk bytes (``store/tier_guard.py``)
        self.budgets_changed()

    def budgets_changed(self) -> None:
        self.guard = self.store.budgets.guards["disk"]
        self.lru = self.store.budgets.queue("disk")

    # -- hooks (ledger.py) -------------------------------------------------------------------------------------
    # No refusal: a full filesystem costs chunks their disk copy, never a put (they are served from DRAM).

    def on_commit(self, entries: Sequence[Entry]) -> None:
        self.queue_writes(entries)

    def on_touch(self, entries: Sequence[Entry]) -> None:
        self.lru.touch_chain(entries)

    def uses_dram(self, entry: Entry) -> bool:
        return entry.disk is DiskState.WRITING

    def keeps(self, entry: Entry) -> bool:
        return entry.disk is DiskState.STORED

    def on_leave_dram(self, entry: Entry, kept: bool) -> None:
        tc = self.store.tier_counters
        if entry.disk is DiskState.STORED:
            tc.demotions_host_disk += 1
            tc.demoted_bytes_host_disk += entry.size
        elif kept:
            self.forget(entry)   # a queued write needs the DRAM slot; the GPU copy is queued when it sinks
        elif entry.disk is DiskState.QUEUED:
            tc.unwritten_evictions += 1

    def on_remove(self, entry: Entry) -> None:
        self.lru.remove(entry)

    def on_free(self, entry: Entry) -> None:
        self.forget(entry)

    # -- the host watermark --------------------------------------------------------------------------------------
    def rebalance(self) -> int:
        """Above the high watermark, drop DRAM copies of chunks already on disk (LRU first) until under the low
        one. Stops at a chunk not yet on disk: that is for the write-back to fix, not for demotion to lose."""
        host = self.store.host
        return shed_to_low(lambda: host.used_bytes > HOST_HIGH_WATERMARK * host.capacity_bytes,
                           lambda: host.used_bytes > HOST_LOW_WATERMARK * host.capacity_bytes,
                           self._next_demotable, self._demote_host_copy)

    def _next_demotable(self) -> Entry | None:
        """The oldest DRAM chunk, if its DRAM copy can go now without losing it (it is on disk)."""
        victim = self.store.lru.peek_oldest()
        if victim is None or victim.disk is not DiskState.STORED or victim.gpu_loading is not None \
                or victim.checking:
            return None
        return victim

    def _demote_host_copy(self, entry: Entry) -> bool:
        self.store.lru.pop_oldest()
        self.store.drop_host_copy(entry)
        return True

    # -- start-up ------------------------------------------------------------------------------------------------
    def adopt(self, key: bytes, size: int, namespace: str, footprint: int, checksum: int | None = None,
              parent: bytes | None = None, engine: EngineBlocks | None = None,
              retention: Retention = Retention.NORMAL) -> bool:
        """Index a chunk found on disk at start (call oldest first), in the retention class its file keeps. False
        when it does not fit the cap."""
        store = self.store
        if key in store.index:
            return False
        entry = Entry(key, size, namespace, parent, State.COMMITTED, disk=DiskState.STORED, checksum=checksum,
                      engine=engine, retention=retention)
        if retention is not Retention.NORMAL:
            store.retention.split_queues()   # before it is queued: it goes to its class's queue
        store.budgets.assign(entry)   # its disk bytes are charged again to the tenant of its namespace
        if not self._charge(footprint, entry):
            return False
        self._set_disk_bytes(entry, footprint)
        store.index[key] = entry
        self.lru.add_newest(entry)
        store.sync(key)
        return True

    # -- write-back ----------------------------------------------------------------------------------------------
    def queue_writes(self, entries: Sequence[Entry]) -> None:
        """Queue committed chunks for write-back (commit order: prefixes first) and wake the mover."""
        if not entries:
            return
        for entry in entries:
            entry.disk = DiskState.QUEUED
            self.dirty.append(entry)
            self.dirty_bytes += entry.size
        self.lru.add_chain(entries)
        if self.mover is not None:
            self.mover.wake()

    def expect(self, nbytes: int) -> None:
        """``nbytes`` more (or, negative, fewer) are being checksummed and will be queued: back-pressure counts
        them already (``integrity.py``)."""
        self.dirty_bytes += nbytes

    def over_bound(self, nbytes: int, bound: int) -> bool:
        """Whether queuing ``nbytes`` more would pass the write-back bound (a lone large put always passes)."""
        return self.dirty_bytes > 0 and self.dirty_bytes + nbytes > bound

    def next_write(self) -> DiskWrite[Entry] | None:
        """Take the next queued chunk for writing, with its disk space charged; None when the queue is empty.

        Returns:
            The write: the chunk, its host slot, and what its file's header records (its class where a pin does
            not reach, ``retention.stored_class``; its namespace's key parameters).
        """
        while self.dirty:
            entry = self.dirty.popleft()
            self.dirty_bytes -= entry.size
            if entry.disk is not DiskState.QUEUED or self.store.index.get(entry.key) is not entry \
                    or entry.host_offset is None:
                continue  # deleted or evicted while queued
            footprint = self.disk.footprint(entry.size)
            if not self._charge(footprint, entry):
                self.forget(entry)
                self.store.tier_counters.disk_write_skipped += 1
                continue
            entry.disk = DiskState.WRITING
            self._set_disk_bytes(entry, footprint)
            self.dirty_bytes += entry.size
            return DiskWrite(entry, entry.host_offset, entry.parent, entry.engine, stored_class(entry),
                             self.store.key_params.get(entry.namespace))
        return None

    def finish_write(self, entry: Entry, stored: int | None, error: BaseException | None) -> None:
        """A write ended: ``stored`` payload bytes, or ``error``."""
        self.dirty_bytes -= entry.size
        tc = self.store.tier_counters
        if error is not None:
            damaged = isinstance(error, DamagedSource)   # the slot failed its check: nothing was written
            no_space = getattr(error, "errno", None) == errno.ENOSPC
            tc.io_errors += not damaged and not no_space
            tc.disk_write_skipped += 1
            if no_space:   # the filesystem filled (another program, or its overheads): this chunk stays in DRAM
                tc.disk_full_writes += 1
                self.full_reason = (f"the filesystem of {self.disk.directory} has no space left for a "
                                    f"{entry.size}-byte chunk; chunks are kept in DRAM only until it has")
                self.full_need = 2 * entry.disk_bytes
            entry.disk = DiskState.NONE
            self.disk.uncharge(entry.disk_bytes)
            self._set_disk_bytes(entry, 0)
            self.lru.remove(entry)
            if entry.doomed:
                self.store.release_if_idle(entry)
            elif damaged:
                self.store.damage.damaged(entry, "host")
            return
        assert stored is not None
        entry.disk = DiskState.STORED
        actual = self.disk.footprint(stored)
        self.disk.used_bytes -= entry.disk_bytes - actual
        self._set_disk_bytes(entry, actual)
        tc.disk_writes += 1
        tc.disk_write_bytes += stored
        self.full_reason = ""
        self.store.sync(entry.key)   # a copy on disk now: the event sink hears of it
        if entry.doomed:
            self.store.release_if_idle(entry)

    def space_back(self, free: int) -> bool:
        """The mover saw ``free`` bytes free on the filesystem: clear "disk full" if that is enough."""
        if self.full_reason and free >= self.full_need:
            self.full_reason = ""
            return True
        return False

    # -- promotion -------------------------------------------------------------------------------------------------
    def to_promote(self, keys: Sequence[bytes]) -> list[Entry]:
        """The disk-only chunks of the longest stored prefix of ``keys``, cut where the prefix would pass half the
        host tier: promoting more would evict the prefix's own first chunks to make room for its last ones."""
        budget = self.store.host.capacity_bytes // 2
        chosen = []
        for entry in self.store.leading(keys):
            budget -= entry.size
            if budget < 0:
                break
            if entry.host_offset is None and entry.gpu_offset is None:
                chosen.append(entry)
        return chosen

    def start_promote(self, entry: Entry) -> int | None:
        """Give a disk-only chunk a host slot to be read into; None if it is not promotable or DRAM is full."""
        if entry.host_offset is not None or entry.gpu_offset is not None or entry.loading is not None \
                or entry.disk is not DiskState.STORED or not entry.readable:
            return None
        try:
            offset = self.store.allocate_host(entry.size, namespace=entry.namespace)   # held to its budget
        except StoreFullError:
            return None
        entry.loading = offset
        self.lru.remove(entry)
        return offset

    def finish_promote(self, entry: Entry, error: BaseException | None, checksum: int | None = None) -> bool:
        """A promotion read ended (``checksum``: the one the file holds, checked against the bytes read). On error
        the chunk is a miss from now on: a bad file is quarantined and the chunk dropped with its continuations."""
        store = self.store
        offset, entry.loading = entry.loading, None
        tc = store.tier_counters
        if error is None and not entry.doomed:
            entry.learn_checksum(checksum)
            store.fill_host(entry, offset)
            self.lru.add_chain([entry])
            tc.promotions_disk_host += 1
            tc.promoted_bytes_disk_host += entry.size
            tc.disk_reads += 1
            tc.disk_read_bytes += entry.size
            return True
        store.host.free(offset)
        if error is not None:
            bad = isinstance(error, (ChecksumError, FormatError))
            if bad:
                tc.checksum_failures += 1
            else:
                tc.io_errors += 1
            if bad and not entry.doomed:
                store.damage.damaged(entry, "disk")
            if not entry.doomed:
                store.unindex(entry)
            self.drop_copy(entry, quarantine=str(error) if bad else None)
            entry.doomed = True
        store.release_if_idle(entry)
        return False

    # -- copies ------------------------------------------------------------------------------------------------------
    def rewrite(self, entry: Entry) -> None:
        """The file failed its checksum but DRAM holds the chunk: quarantine the file and write it again."""
        self.drop_copy(entry, quarantine="disk copy failed its checksum")
        self.lru.remove(entry)
        self.queue_writes([entry])   # written again from DRAM, after its own check

    def _charge(self, footprint: int, entry: Entry) -> bool:
        """Make room on disk and charge ``footprint`` bytes for ``entry``; False if impossible. With tenants'
        disk budgets the room is made as in DRAM (``store/tier_guard.py``): ``entry``'s tenant's own files while
        it would pass its ceiling (else False, counted against it), then the shared disk pool, which holds no
        file whose loss would take its tenant below its guarantee, then its own guaranteed files. Chunks queued
        or being written are not evictable from disk yet."""
        if footprint > self.disk.capacity_bytes:
            return False
        disk = self.disk
        attempt = lambda: True if disk.charge(footprint) else None  # noqa: E731
        guard = self.store.budgets.held("disk")
        if guard is None:
            return make_room(attempt, self.lru, stored, self._evict) is not None
        if not guard.keep_under_ceiling(entry.tenant, footprint, stored, self._evict):
            return False
        return guard.make_room(entry.tenant, attempt, stored, self._evict) is not None

    def _set_disk_bytes(self, entry: Entry, nbytes: int) -> None:
        """The one place ``Entry.disk_bytes`` changes: the tenant's disk use follows it."""
        if nbytes != entry.disk_bytes:
            assert self.guard is not None
            delta, entry.disk_bytes = nbytes - entry.disk_bytes, nbytes
            self.guard.charge(entry, delta)   # after the field: the guard reads it

    def _evict(self, entry: Entry) -> None:
        """A chunk leaves the disk tier (already out of the disk LRU); it is lost unless held in memory."""
        tc = self.store.tier_counters
        tc.evictions_disk += 1
        tc.evicted_bytes_disk += entry.size
        self.drop_copy(entry)
        if entry.host_offset is None and entry.gpu_offset is None and entry.loading is None and not entry.doomed:
            self.store.lost(entry)

    def drop_copy(self, entry: Entry, quarantine: str | None = None) -> None:
        """The chunk's file goes (uncharged now, removed by the mover in order with its writes; at once before the
        mover exists, as files evicted while the index is rebuilt)."""
        if entry.disk is DiskState.STORED:
            self.disk.uncharge(entry.disk_bytes)
            self._set_disk_bytes(entry, 0)
            entry.disk = DiskState.NONE
            if self.mover is not None:
                self.mover.remove_file(entry.key, quarantine)
            elif quarantine is None:
                self.disk.remove(entry.key)   # at start-up (the index rebuild), before the mover exists
            else:
                self.disk.quarantine(entry.key, quarantine)
            if quarantine is not None:
                self.store.tier_counters.quarantined += 1
            self.store.sync(entry.key)

    def forget(self, entry: Entry) -> None:
        """The chunk will not (or no longer) be on disk: drop a stored copy; a queued one is skipped later."""
        if entry.disk is DiskState.NONE:
            return   # not on disk, so not in the disk LRU
        if entry.disk is DiskState.STORED:
            self.drop_copy(entry)
        elif entry.disk is DiskState.QUEUED:
            entry.disk = DiskState.NONE
        if entry.disk is DiskState.NONE:
            self.lru.remove(entry)


def stored(entry: Entry) -> bool:
    """Whether a chunk's disk copy may be evicted: only a complete file (not one queued or being written)."""
    return entry.disk is DiskState.STORED
