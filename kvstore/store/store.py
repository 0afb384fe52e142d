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
"""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass, field
from collections import deque
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from ..errors import ChecksumError, DamagedSource, FormatError, LeaseError, ReservationError, StoreFullError
from ..tiers.disk import DiskTier
from ..tiers.host import HostTier
from .damage import DamageMixin, IntegrityCounters
from ..protocol.index_layout import STATE_OF_TIER
from .credits import CreditBook
from .entry import DiskState, Entry, State
from .policies import DEFAULT_POLICY, make_queue
from .handles import Handle, HandleTable

if TYPE_CHECKING:
    from ..gpu.tier import GpuTier


@dataclass
class StoreCounters:
    lookups: int = 0
    lookup_keys: int = 0
    hit_keys: int = 0
    puts: int = 0
    put_chunks: int = 0
    put_bytes: int = 0
    gets: int = 0
    get_chunks: int = 0
    get_bytes: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    expired_leases: int = 0
    expired_reservations: int = 0
    full_errors: int = 0


@dataclass
class TierCounters:
    """Movements between tiers, in chunks and bytes (plain fields: exported as they are)."""

    promotions_disk_host: int = 0
    promoted_bytes_disk_host: int = 0
    demotions_host_disk: int = 0
    demoted_bytes_host_disk: int = 0
    evictions_host: int = 0          # left DRAM with no disk copy: lost
    evictions_disk: int = 0          # left the disk tier (a DRAM copy may remain)
    evicted_bytes_disk: int = 0
    disk_writes: int = 0
    disk_write_bytes: int = 0        # bytes stored on disk (after compression)
    disk_write_skipped: int = 0      # no room on disk even after eviction, or write failed
    disk_reads: int = 0
    disk_read_bytes: int = 0
    checksum_failures: int = 0
    io_errors: int = 0
    quarantined: int = 0
    unwritten_evictions: int = 0     # evicted from DRAM while still waiting for write-back
    promotions_host_gpu: int = 0
    promoted_bytes_host_gpu: int = 0
    demotions_gpu_host: int = 0      # left the GPU tier with a DRAM copy (kept, or copied down)
    demoted_bytes_gpu_host: int = 0
    demotions_gpu_disk: int = 0      # left the GPU tier with only a disk copy below it
    demoted_bytes_gpu_disk: int = 0
    gpu_copies_down: int = 0         # demotions that had to copy the bytes back into DRAM first
    promotions_remote_host: int = 0  # chunks fetched from the remote store into DRAM
    promoted_bytes_remote_host: int = 0


class DiskIo(Protocol):
    """What the Store asks of the tier manager: start writing, and remove files in order with writes."""

    def wake_writer(self) -> None: ...

    def remove_file(self, key: bytes, quarantine: str | None = None) -> None: ...


class IndexSink(Protocol):
    """Where the Store publishes each key's readable state for clients (``published_index.py``)."""

    def set(self, key: bytes, state: int) -> None: ...

    def remove(self, key: bytes) -> None: ...


class RemoteSink(Protocol):
    """What the Store tells the remote mover: these chunks were just committed by a put."""

    def after_commit(self, entries: list[Entry]) -> None: ...


class SumSink(Protocol):
    """What the Store tells the checksummer (``integrity.py``): take these committed chunks' sums, then call
    ``Store.checksummed``."""

    def after_commit(self, entries: list[Entry]) -> None: ...


HOST_HIGH_WATERMARK = 0.95
HOST_LOW_WATERMARK = 0.85
GPU_HIGH_WATERMARK = 0.95
GPU_LOW_WATERMARK = 0.85
GPU_PROMOTE_HITS = 2    # the second get that finds a chunk in DRAM asks for its promotion


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


class Store(DamageMixin):
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
        if self.gpu is not None:
            self._count_hits(found)
        c = self.counters
        c.gets += 1
        c.get_chunks += len(found)
        c.get_bytes += sum(e.size for e in found)
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

    def wants_gpu(self) -> bool:
        """Whether some chunk asked for a GPU promotion that the GPU mover has not taken yet."""
        return bool(self.gpu_wanted)

    def count_remote_hits(self, chunks: int) -> None:
        """A lookup found ``chunks`` more in the remote store (or being fetched from it) past its local walk."""
        self.counters.hit_keys += chunks

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

    def rebalance(self) -> int:
        """Above the high watermark, drop DRAM copies of chunks already on disk (LRU first) until under the low
        one. Stops at a chunk not yet on disk: that is for the write-back to fix, not for demotion to lose."""
        if self.disk is None or self.host.used_bytes <= HOST_HIGH_WATERMARK * self.host.capacity_bytes:
            return 0
        demoted = 0
        while self.host.used_bytes > HOST_LOW_WATERMARK * self.host.capacity_bytes:
            victim = self.lru.peek_oldest()
            if victim is None or victim.disk is not DiskState.STORED or victim.gpu_loading is not None \
                    or victim.checking:
                break
            self.lru.pop_oldest()
            self._drop_host_copy(victim)
            demoted += 1
        return demoted

    # -- disk tier: called by the tier manager ----------------------------------------------------------------
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

    def gpu_only(self, keys: Sequence[bytes]) -> list[Entry]:
        """The chunks of the longest stored prefix of ``keys`` that only the GPU tier holds in memory: what a
        reader without the GPU mapping needs copied down before it can read them."""
        return [e for e in self.leading(keys) if e.host_offset is None and e.gpu_offset is not None]

    def committed_chunks(self) -> int:
        return sum(1 for e in self.index.values() if e.state is State.COMMITTED)

    # -- remote tier: called by the remote mover (remote_mover.py) -------------------------------------------
    def pin_chain(self, entries: Sequence[Entry]) -> None:
        """Keep committed chunks' slots in place (out of every LRU) until ``unpin_chain``: a remote put reads them."""
        for entry in entries:
            self._pin(entry)

    def unpin_chain(self, entries: Sequence[Entry]) -> None:
        self._unpin_chain(list(entries))

    def start_remote_fetch(self, namespace: str, keys: Sequence[bytes], sizes: Sequence[int],
                           parent: bytes | None) -> list[Entry]:
        """Host slots for chunks the remote store holds, in chain order, as RESERVED entries. Stops at a key already
        indexed (stored, or being written or fetched), at a slot that cannot be had without evicting pinned
        chunks, and where the chain would pass half the host tier (it would evict its own prefix)."""
        budget = self.host.capacity_bytes // 2
        entries: list[Entry] = []
        prev = parent
        for key, size in zip(keys, sizes):
            budget -= size
            if budget < 0 or key in self.index:
                break
            try:
                offset = self._allocate(size)
            except StoreFullError:
                break
            entry = Entry(key, size, namespace, prev, State.RESERVED, host_offset=offset)
            self.index[key] = entry
            entries.append(entry)
            prev = key
        return entries

    def finish_remote_fetch(self, entries: Sequence[Entry], loaded: int,
                            sums: Sequence[int | None] = ()) -> int:
        """The first ``loaded`` entries hold their bytes, checked against the records' ``sums``: publish them with
        those sums (and queue them for the disk); free the rest. Returns how many were published."""
        good = list(entries[:loaded])
        for entry, checksum in zip(good, sums):
            entry.checksum = checksum
        for entry in good:
            entry.state = State.COMMITTED
            self._sync(entry.key)
        self.lru.add_chain(good)
        self._queue_writes(good)
        self._drop_reserved(list(entries[loaded:]))
        tc = self.tier_counters
        tc.promotions_remote_host += len(good)
        tc.promoted_bytes_remote_host += sum(e.size for e in good)
        return len(good)

    # -- internals: the one place each resource is taken and given back ---------------------------------------
    def _sync(self, key: bytes) -> None:
        """Publish ``key``'s readable state as it is now (called after every change to it): its fastest tier, or
        gone. Read from the index rather than from a changed entry, since a doomed entry freed late must not
        unlist the new chunk stored under its key since."""
        if self.published is None:
            return
        entry = self.index.get(key)
        if entry is not None and entry.readable:
            self.published.set(key, STATE_OF_TIER[top_tier(entry)])
        else:
            self.published.remove(key)

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

    def _allocate(self, size: int) -> int:
        skipped: list[Entry] = []   # chunks being written: their slots are in use until the write ends
        try:
            while True:
                offset = self.host.allocate(size)
                if offset is not None:
                    return offset
                victim = self.lru.pop_oldest()
                if victim is None:
                    raise StoreFullError(
                        f"host tier is full: no room for a {size}-byte chunk and every stored chunk is leased or "
                        f"being written ({self.host.used_bytes} of {self.host.capacity_bytes} bytes in use)")
                if victim.disk is DiskState.WRITING or victim.gpu_loading is not None or victim.checking:
                    skipped.append(victim)
                    continue
                self._drop_host_copy(victim)
        finally:
            self.lru.push_oldest(skipped)

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

    def _charge_disk(self, footprint: int) -> bool:
        """Make room on disk (evicting its LRU chunks) and charge ``footprint`` bytes; False if impossible."""
        assert self.disk is not None
        if footprint > self.disk.capacity_bytes:
            return False
        skipped: list[Entry] = []
        try:
            while not self.disk.charge(footprint):
                victim = self.disk_lru.pop_oldest()
                if victim is None:
                    return False
                if victim.disk is not DiskState.STORED:
                    skipped.append(victim)   # queued or being written: not evictable from disk yet
                    continue
                self._evict_from_disk(victim)
            return True
        finally:
            self.disk_lru.push_oldest(skipped)

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

    def _free_gpu(self, entry: Entry) -> None:
        if entry.gpu_offset is not None:
            assert self.gpu is not None
            self.gpu.free(entry.gpu_offset)
            entry.gpu_offset = None
            self._sync(entry.key)
            entry.hits = 0   # back up only on new repeated hits: a demoted chunk must not bounce straight back
            self.gpu_lru.remove(entry)

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

    # -- GPU tier: called by the GPU mover (gpu_mover.py) ---------------------------------------------------
    def _count_hits(self, found: list[Entry]) -> None:
        for entry in found:
            if entry.gpu_offset is not None:
                continue
            entry.hits += 1
            if entry.hits >= GPU_PROMOTE_HITS and entry.gpu_loading is None:
                self.gpu_wanted[entry.key] = entry

    def start_gpu_promote(self, entry: Entry) -> int | None:
        """Give a DRAM chunk a GPU slot to be copied into; None if it is not promotable or no slot frees up."""
        if self.gpu is None or not entry.readable or self.index.get(entry.key) is not entry \
                or entry.host_offset is None or entry.gpu_offset is not None or entry.gpu_loading is not None:
            return None
        offset = self._allocate_gpu(entry.size)
        if offset is not None:
            entry.gpu_loading = offset
        return offset

    def finish_gpu_promote(self, entry: Entry, ok: bool) -> bool:
        """The copy into the GPU slot ended: publish the slot (or give it back on failure or delete)."""
        assert self.gpu is not None
        offset, entry.gpu_loading = entry.gpu_loading, None
        if not ok or entry.doomed:
            self.gpu.free(offset)
            if entry.doomed:
                self._release_if_idle(entry)
            return False
        entry.gpu_offset = offset
        self._sync(entry.key)
        if entry.pins == 0:
            self.gpu_lru.add_chain([entry])
        self.tier_counters.promotions_host_gpu += 1
        self.tier_counters.promoted_bytes_host_gpu += entry.size
        return True

    def gpu_over_high(self, leaving: int = 0) -> bool:
        return self.gpu is not None and self.gpu.used_bytes - leaving > GPU_HIGH_WATERMARK * self.gpu.capacity_bytes

    def gpu_over_low(self, leaving: int = 0) -> bool:
        return self.gpu is not None and self.gpu.used_bytes - leaving > GPU_LOW_WATERMARK * self.gpu.capacity_bytes

    def start_gpu_demote(self, entry: Entry, to_host: bool = False) -> int | None:
        """Move a chunk out of the GPU tier. Free at once when a DRAM copy exists, or a disk copy and
        ``to_host`` is false (returns None); otherwise returns the host slot the GPU slot must be copied into
        before ``finish_gpu_demote``. Raises StoreFullError when DRAM has no room for it."""
        assert self.gpu is not None
        self.gpu_lru.remove(entry)
        if entry.host_offset is not None or (entry.disk is DiskState.STORED and not to_host):
            to_host = entry.host_offset is not None
            self._free_gpu(entry)
            self._count_gpu_demotion(entry, "host" if to_host else "disk")
            return None
        try:
            entry.loading = self._allocate(entry.size)
        except StoreFullError:
            if entry.pins == 0:
                self.gpu_lru.push_oldest([entry])
            raise
        return entry.loading

    def gpu_victim(self) -> Entry | None:
        """The GPU chunk to demote next: the least recently used one that is not leased."""
        return self.gpu_lru.peek_oldest()

    def finish_gpu_demote(self, entry: Entry, ok: bool) -> None:
        """The copy down ended: the chunk lives in DRAM (and its GPU slot goes, unless it was leased meanwhile)."""
        offset, entry.loading = entry.loading, None
        if not ok or entry.doomed:
            self.host.free(offset)
            if entry.doomed:
                self._release_if_idle(entry)
            elif entry.pins == 0:
                self.gpu_lru.push_oldest([entry])
            return
        entry.host_offset = offset
        self._sync(entry.key)
        self.tier_counters.gpu_copies_down += 1
        if entry.pins == 0:
            self.lru.add_chain([entry])
            self._free_gpu(entry)
            self._count_gpu_demotion(entry, "host")
        if self.disk is not None and entry.disk is DiskState.NONE:
            entry.disk = DiskState.QUEUED   # it lost its queued write when it left DRAM for the GPU tier
            self.dirty.append(entry)
            self.dirty_bytes += entry.size
            self.disk_lru.add_newest(entry)
            if self.io is not None:
                self.io.wake_writer()

    def _count_gpu_demotion(self, entry: Entry, to: str) -> None:
        tc = self.tier_counters
        setattr(tc, f"demotions_gpu_{to}", getattr(tc, f"demotions_gpu_{to}") + 1)
        setattr(tc, f"demoted_bytes_gpu_{to}", getattr(tc, f"demoted_bytes_gpu_{to}") + entry.size)

    def _allocate_gpu(self, size: int) -> int | None:
        """A GPU slot, making room by dropping GPU copies that have a copy below (oldest first); None if even
        then there is none: copies that must be copied down first are the background demotion's job."""
        assert self.gpu is not None
        skipped: list[Entry] = []
        try:
            while True:
                offset = self.gpu.allocate(size)
                if offset is not None:
                    return offset
                victim = self.gpu_lru.pop_oldest()
                if victim is None:
                    return None
                if victim.host_offset is None and victim.disk is not DiskState.STORED:
                    skipped.append(victim)
                    continue
                self.start_gpu_demote(victim)
        finally:
            self.gpu_lru.push_oldest(skipped)


def top_tier(entry: Entry) -> str:
    """The fastest tier that holds the chunk."""
    if entry.gpu_offset is not None:
        return "gpu"
    return "host" if entry.host_offset is not None else "disk"
