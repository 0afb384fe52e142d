"""The Store: the daemon's index of chunks, and the only code that pins, unpins, allocates and frees them.

Index: a flat dict from 16-byte chained key to ``Entry``. Because every key commits to its whole prefix, a
lookup walks the request's keys in order and stops at the first one that is not readable: O(chunks asked).

Put is two-phase. ``reserve`` allocates space and inserts RESERVED entries that readers cannot see; the writer
copies its bytes into the arena; ``commit`` makes them readable, ``abort`` frees them. A reservation carries a
deadline, so space reserved by a writer that died is reclaimed by ``expire``.

Get pins the chunks under a lease (one pin per lease per chunk), which keeps them out of the eviction queue
until ``release`` or the lease's deadline. Pins are taken in exactly one place (``_pin``) and dropped in exactly
one place (``_unpin``); a chunk deleted while pinned is "doomed" and freed by its last unpin.

When an allocation fails, the least recently used unpinned chunk is evicted (continuations first, see
``eviction.py``) until it succeeds; when nothing is left to evict the put fails with StoreFullError.

With a disk tier the Store also keeps where each chunk lives (``Entry.host_offset``, ``Entry.disk``) and a second
LRU queue for the disk. Committed chunks are queued for write-back (``dirty``); the tier manager
(``manager.py``) drains that queue on worker threads and reports back through ``start_write``/``finish_write``
and ``start_promote``/``finish_promote``: the Store stays the only code that allocates, frees and pins, and all
of it runs on the event loop. Leaving the host tier is a *demotion* (the slot is freed, the file stays) when the
chunk is on disk, and an eviction otherwise; leaving the disk tier is an eviction unless the chunk is still in
DRAM. A chunk being written keeps its place in the host LRU (so a chain keeps its order) but is skipped as a
victim until its write ends; a chunk being promoted is out of the disk LRU until its read ends.

With a GPU tier (``Entry.gpu_offset``, a third LRU queue ``gpu_lru``) puts still land in DRAM; the second get
that finds a chunk in DRAM asks for its promotion (``gpu_wanted``), which the GPU mover (``gpu_mover.py``) runs
as an asynchronous copy between ``start_gpu_promote`` and ``finish_gpu_promote``. The DRAM copy is kept, so a
GPU copy can usually leave for free; DRAM pressure may drop the DRAM copy of a chunk held in the GPU tier (it
then lives there alone), and such a chunk is copied back down (``start_gpu_demote`` / ``finish_gpu_demote``)
before its GPU slot is freed. A leased chunk is in no LRU queue, so it is never chosen for demotion, and a GPU
slot whose chunk was leased during its copy down is kept until the lease ends.

With a remote tier (``remote_mover.py``) every commit is handed to ``remote`` (the mover), which pins the new
chunks (``pin_chain``) while a background put reads their slots and unpins them (``unpin_chain``) when it ends.
Chunks found in the remote store get host slots from ``start_remote_fetch`` as RESERVED entries (invisible to
readers; a put of the same key sees them as being written) and are published, or dropped, by
``finish_remote_fetch``; published ones are queued for the disk like a put.

This file keeps the core (index, leases, reservations, the DRAM arena, allocate/free/pin/unpin); each lower tier's
bookkeeping is a mixin of its own file: ``disk_ledger.py``, ``gpu_ledger.py``, ``remote_ledger.py``; the
counters are in ``counters.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections import deque
from itertools import takewhile
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from ..errors import LeaseError, ReservationError, StoreFullError
from ..tiers.disk import DiskTier
from ..tiers.host import HostTier
from .counters import StoreCounters, TierCounters
from .damage import DamageMixin, IntegrityCounters
from .disk_ledger import DiskLedger
from .gpu_ledger import GpuLedger
from .remote_ledger import RemoteLedger
from .room import make_room
from ..protocol.index_layout import STATE_OF_TIER
from .credits import CreditBook
from .entry import DiskState, Entry, State
from .policies import DEFAULT_POLICY, make_queue
from .handles import Handle, HandleTable

if TYPE_CHECKING:
    from ..gpu.tier import GpuTier


class DiskIo(Protocol):
    """What the Store asks of the tier manager: start writing, and remove files in order with writes."""

    def wake_writer(self) -> None: ...

    def remove_file(self, key: bytes, quarantine: str | None = None) -> None: ...


class IndexSink(Protocol):
    """Where the Store publishes each key's readable state for clients (``published_index.py``)."""

    def set(self, key: bytes, state: int, host: int | None = None, size: int = 0) -> None: ...

    def remove(self, key: bytes) -> None: ...


class RemoteSink(Protocol):
    """What the Store tells the remote mover: these chunks were just committed by a put."""

    def after_commit(self, entries: list[Entry]) -> None: ...


class SumSink(Protocol):
    """What the Store tells the checksummer (``integrity.py``): take these committed chunks' sums, then call
    ``Store.checksummed``."""

    def after_commit(self, entries: list[Entry]) -> None: ...




@dataclass(frozen=True)
class Slot:
    """Where a reserved or leased chunk lives in the host arena."""

    offset: int
    size: int


@dataclass(frozen=True)
class LookupResult:
    count: int
    tiers: list[str]


@dataclass
class Reservation:
    namespace: str
    entries: list[Entry]
    present: list[Entry] = field(default_factory=list)


class Store(DamageMixin, DiskLedger, GpuLedger, RemoteLedger):
    def __init__(self, host: HostTier, lease_ttl: float, reserve_ttl: float,
                 clock: Callable[[], float] = time.monotonic, disk: DiskTier | None = None,
                 gpu: "GpuTier | None" = None, policy: str = DEFAULT_POLICY) -> None:
        self.host = host
        self.disk = disk
        self.gpu = gpu
        self.policy = policy                 # eviction order of every tier (policies.py)
        self.gpu_lru = make_queue(policy)
        self.gpu_wanted: dict[bytes, Entry] = {}   # promotion requests, oldest first (drained by the mover)
        self.disk_lru = make_queue(policy)
        self.dirty: deque[Entry] = deque()   # write-back queue, commit order (prefixes first)
        self.dirty_bytes = 0                 # bytes queued or being written
        self.io: DiskIo | None = None        # set by the tier manager
        self.remote: RemoteSink | None = None   # set by the remote mover
        self.sums: SumSink | None = None        # set by the checksummer: commits go through it first
        self.integrity = IntegrityCounters()
        self.published: IndexSink | None = None   # the shared lookup index, when the daemon publishes one
        self.tier_counters = TierCounters()
        self.disk_full_reason = ""           # set when the filesystem said ENOSPC; puts fail until cleared
        self.disk_full_need = 0              # free bytes that clear it (checked by the tier manager)
        self.lease_ttl = lease_ttl
        self.reserve_ttl = reserve_ttl
        self.clock = clock
        self.index: dict[bytes, Entry] = {}
        self.lru = make_queue(policy)
        self.leases: HandleTable[list[Entry]] = HandleTable("lease", LeaseError)
        self.reservations: HandleTable[Reservation] = HandleTable("reservation", ReservationError)
        self.counters = StoreCounters()
        self.credits = CreditBook(self)   # free arena space lent to writers, so a put needs no RESERVE

    # -- lookup -------------------------------------------------------------------------------------------
    def leading(self, keys: Sequence[bytes]) -> list[Entry]:
        """The readable entries of the longest stored prefix of ``keys``."""
        found = []
        for key in keys:
            entry = self.index.get(key)
            if entry is None or not entry.readable:
                break
            found.append(entry)
        return found

    def lookup(self, keys: Sequence[bytes]) -> LookupResult:
        found = self.leading(keys)
        self._touch_looked_up(found, len(keys), len(found))
        return LookupResult(len(found), [top_tier(e) for e in found])

    def note_lookup(self, asked: int, found_keys: Sequence[bytes]) -> None:
        """A lookup a client answered from the shared index (``found_keys`` leading keys of ``asked``): touch the
        chain, or what is left of it, and count the lookup as ``lookup`` would have."""
        self._touch_looked_up(self.leading(found_keys), asked, len(found_keys))

    def note_read(self, keys: Sequence[bytes]) -> None:
        """A get a local client copied out of the arena itself (``client/arena_read.py``): touched and counted
        as ``get`` would (its pin and unpin move the chain to the newest end of the queues)."""
        found = list(takewhile(lambda e: e.host_offset is not None, self.leading(keys)))
        self.lru.touch_chain(found)
        self.gpu_lru.touch_chain([e for e in found if e.gpu_offset is not None])
        self._count_get(found)

    def _count_get(self, found: list[Entry]) -> None:
        if self.gpu is not None:
            self._count_hits(found)
        c = self.counters
        c.gets += 1
        c.get_chunks += len(found)
        c.get_bytes += sum(e.size for e in found)

    def _touch_looked_up(self, found: list[Entry], asked: int, hits: int) -> None:
        self.lru.touch_chain(found)
        self.disk_lru.touch_chain(found)
        self.gpu_lru.touch_chain(found)
        c = self.counters
        c.lookups += 1
        c.lookup_keys += asked
        c.hit_keys += hits

    # -- two-phase put --------------------------------------------------------------------------------------
    def reserve(self, owner: bytes, namespace: str, keys: Sequence[bytes], sizes: Sequence[int],
                parent: bytes | None) -> tuple[Handle[Reservation], list[Slot | None]]:
        """Allocate space for the keys not stored yet. Slot None means "already stored or being written"."""
        if self.disk_full_reason:
            self.counters.full_errors += 1
            raise StoreFullError(self.disk_full_reason)
        res = Reservation(namespace, [])
        slots: list[Slot | None] = []
        prev = parent
        try:
            for key, size in zip(keys, sizes):
                existing = self.index.get(key)
                if existing is not None:
                    if existing.readable:
                        res.present.append(existing)
                    slots.append(None)
                else:
                    entry = Entry(key, size, namespace, prev, State.RESERVED)
                    entry.host_offset = self._allocate(size)
                    self.index[key] = entry
                    res.entries.append(entry)
                    slots.append(Slot(entry.host_offset, size))
                prev = key
        except StoreFullError:
            self._drop_reserved(res.entries)
            self.counters.full_errors += 1
            raise
        self.lru.touch_chain(res.present)
        handle = self.reservations.issue(owner, res, self.reserve_ttl, self.clock())
        return handle, slots

    def commit(self, owner: bytes, rid: int) -> int:
        return self.publish(self.reservations.take(owner, rid).payload.entries)

    def publish(self, entries: list[Entry]) -> int:
        """Make a reservation's written entries readable (a commit, or a put into a credit: ``credits.py``)."""
        for entry in entries:
            entry.state = State.COMMITTED
            self._sync(entry.key)
        self.lru.add_chain(entries)
        if self.sums is not None and entries:
            self.sums.after_commit(entries)   # then write-back and the remote put, which carry the sums
        else:
            self.checksummed(entries)
        c = self.counters
        c.puts += 1
        c.put_chunks += len(entries)
        c.put_bytes += sum(e.size for e in entries)
        return len(entries)

    def abort(self, owner: bytes, rid: int) -> int:
        res = self.reservations.take(owner, rid).payload
        self._drop_reserved(res.entries)
        return len(res.entries)

    # -- leased reads ---------------------------------------------------------------------------------------
    def get(self, owner: bytes, keys: Sequence[bytes],
            gpu_ok: bool = False) -> tuple[Handle[list[Entry]] | None, list[Entry]]:
        """Pin the longest prefix of ``keys`` held in DRAM (or in the GPU tier, when the caller maps it) under a
        new lease (None when there is none)."""
        found = []
        for entry in self.leading(keys):
            if entry.host_offset is None and not (gpu_ok and entry.gpu_offset is not None):
                break
            found.append(entry)
        self._count_get(found)
        if not found:
            return None, []
        for entry in found:
            self._pin(entry)
        return self.leases.issue(owner, found, self.lease_ttl, self.clock()), found

    def release(self, owner: bytes, lease_id: int) -> int:
        entries = self.leases.take(owner, lease_id).payload
        self._unpin_chain(entries)
        return len(entries)

    def extend(self, owner: bytes, lease_id: int) -> float:
        handle = self.leases.extend(owner, lease_id, self.clock())
        return handle.deadline - self.clock()

    def read(self, entry: Entry) -> memoryview:
        """The DRAM bytes of a chunk the caller holds a lease or reservation on."""
        assert entry.host_offset is not None
        return self.host.read(entry.host_offset, entry.size)

    def write(self, slot: Slot, data: object) -> None:
        """Copy a put's bytes into the slot its reservation got."""
        self.host.write(slot.offset, data)

    def arena(self) -> tuple[str, int]:
        """The shared arena's path and size, for clients that map it."""
        return self.host.arena.path, self.host.arena.size

    def entries(self, keys: Sequence[bytes]) -> list[Entry]:
        """The indexed entries of ``keys`` (any state), in order, skipping keys not indexed."""
        return [e for e in (self.index.get(k) for k in keys) if e is not None]

    # -- removal --------------------------------------------------------------------------------------------
    def delete(self, keys: Sequence[bytes]) -> int:
        deleted = 0
        for key in keys:
            entry = self.index.get(key)
            if entry is not None and entry.state is State.COMMITTED:
                self._remove_committed(entry)
                deleted += 1
        return deleted

    def clear(self, namespace: str) -> int:
        """Delete every committed chunk of ``namespace`` (and only those: other namespaces are other engines')."""
        return self.delete([k for k, e in self.index.items()
                            if e.state is State.COMMITTED and e.namespace == namespace])

    def expire(self, keep_leases_of: Callable[[bytes], bool] | None = None) -> tuple[int, int]:
        """Release expired leases (but those of owners ``keep_leases_of`` spares, ``handles.py``) and abort expired
        reservations. Returns how many of each."""
        now = self.clock()
        leases = self.leases.pop_expired(now, keep_leases_of)
        for handle in leases:
            self._unpin_chain(handle.payload)
        reservations = self.reservations.pop_expired(now)
        for handle in reservations:
            self._drop_reserved(handle.payload.entries)
        self.credits.expire(now, keep_leases_of)
        self.counters.expired_leases += len(leases)
        self.counters.expired_reservations += len(reservations)
        return len(leases), len(reservations)

    def drop_owner(self, owner: bytes) -> tuple[int, int]:
        """A client is gone: release its leases and abort its reservations now."""
        leases = self.leases.pop_owner(owner)
        for handle in leases:
            self._unpin_chain(handle.payload)
        reservations = self.reservations.pop_owner(owner)
        for handle in reservations:
            self._drop_reserved(handle.payload.entries)
        self.credits.drop_owner(owner)
        return len(leases), len(reservations)

    def committed_chunks(self) -> int:
        return sum(1 for e in self.index.values() if e.state is State.COMMITTED)

    # -- internals: the one place each resource is taken and given back ---------------------------------------
    def _sync(self, key: bytes) -> None:
        """Publish ``key``'s readable state as it is now (called after every change to it): its fastest tier, or
        gone. Read from the index rather than from a changed entry, since a doomed entry freed late must not
        unlist the new chunk stored under its key since."""
        if self.published is None:
            return
        entry = self.index.get(key)
        if entry is not None and entry.readable:
            self.published.set(key, STATE_OF_TIER[top_tier(entry)], entry.host_offset, entry.size)
        else:
            self.published.remove(key)

    def _allocate(self, size: int) -> int:
        """A DRAM slot, evicting (or demoting) the oldest unpinned chunks until one fits. A chunk being written,
        copied to the GPU tier or checked keeps its slot (and its place in the queue)."""
        offset = make_room(lambda: self.host.allocate(size), self.lru, _may_leave_dram, self._drop_host_copy)
        if offset is None:
            raise StoreFullError(
                f"host tier is full: no room for a {size}-byte chunk and every stored chunk is leased or "
                f"being written ({self.host.used_bytes} of {self.host.capacity_bytes} bytes in use)")
        return offset

    def _drop_host_copy(self, entry: Entry) -> None:
        """An unpinned chunk leaves DRAM (it is already out of the host LRU): demoted if on disk, else evicted."""
        if entry.disk is DiskState.STORED:
            self._free_host(entry)   # a GPU copy, if any, stays
            self.tier_counters.demotions_host_disk += 1
            self.tier_counters.demoted_bytes_host_disk += entry.size
            return
        if entry.gpu_offset is not None:
            self._forget_disk(entry)   # a queued write needs the DRAM slot; the GPU copy is queued when it sinks
            self._free_host(entry)
            return
        if entry.disk is DiskState.QUEUED:
            self.tier_counters.unwritten_evictions += 1
        self.tier_counters.evictions_host += 1
        self._evict(entry)

    def _evict(self, entry: Entry) -> None:
        del self.index[entry.key]
        self._sync(entry.key)
        self.disk_lru.remove(entry)
        self._forget_disk(entry)
        self._free(entry)
        self.counters.evictions += 1
        self.counters.evicted_bytes += entry.size

    def _release_if_idle(self, entry: Entry) -> None:
        """Free what a removed (doomed) chunk still holds, once nothing uses it any more."""
        if entry.busy:
            return
        self._free(entry)
        self._forget_disk(entry)

    def _free(self, entry: Entry) -> None:
        self._free_host(entry)
        self._free_gpu(entry)

    def _free_host(self, entry: Entry) -> None:
        if entry.host_offset is not None:
            self.host.free(entry.host_offset)
            entry.host_offset = None
            self._sync(entry.key)

    def _drop_reserved(self, entries: list[Entry]) -> None:
        for entry in entries:
            if self.index.get(entry.key) is entry:
                del self.index[entry.key]
            self._free(entry)

    def _remove_committed(self, entry: Entry) -> None:
        del self.index[entry.key]
        self._sync(entry.key)
        self.lru.remove(entry)
        self.disk_lru.remove(entry)
        self.gpu_wanted.pop(entry.key, None)
        entry.doomed = True
        self._release_if_idle(entry)

    def _pin(self, entry: Entry) -> None:
        if entry.pins == 0:
            self.lru.remove(entry)
            self.gpu_lru.remove(entry)
        entry.pins += 1

    def _unpin_chain(self, entries: list[Entry]) -> None:
        back_in_queue = []
        for entry in entries:
            entry.pins -= 1
            assert entry.pins >= 0, "unpinned more often than pinned"
            if entry.pins:
                continue
            if entry.doomed:
                self._release_if_idle(entry)
            else:
                back_in_queue.append(entry)
        self.lru.add_chain([e for e in back_in_queue if e.host_offset is not None])
        self.gpu_lru.add_chain([e for e in back_in_queue if e.gpu_offset is not None])


def _may_leave_dram(entry: Entry) -> bool:
    """Whether nothing but the index uses the chunk's DRAM slot (a write, a GPU copy or a check reads it)."""
    return entry.disk is not DiskState.WRITING and entry.gpu_loading is None and not entry.checking


def top_tier(entry: Entry) -> str:
    """The fastest tier that holds the chunk."""
    if entry.gpu_offset is not None:
        return "gpu"
    return "host" if entry.host_offset is not None else "disk"
