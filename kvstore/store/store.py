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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..errors import LeaseError, ReservationError, StoreFullError
from ..tiers.host import HostTier
from .entry import Entry, State
from .eviction import LruQueue
from .handles import Handle, HandleTable


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


class Store:
    def __init__(self, host: HostTier, lease_ttl: float, reserve_ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        self.lease_ttl = lease_ttl
        self.reserve_ttl = reserve_ttl
        self.clock = clock
        self.index: dict[bytes, Entry] = {}
        self.lru = LruQueue()
        self.leases: HandleTable[list[Entry]] = HandleTable("lease", LeaseError)
        self.reservations: HandleTable[Reservation] = HandleTable("reservation", ReservationError)
        self.counters = StoreCounters()

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
        self.lru.touch_chain(found)
        c = self.counters
        c.lookups += 1
        c.lookup_keys += len(keys)
        c.hit_keys += len(found)
        return LookupResult(len(found), [self.host.name] * len(found))

    # -- two-phase put --------------------------------------------------------------------------------------
    def reserve(self, owner: bytes, namespace: str, keys: Sequence[bytes], sizes: Sequence[int],
                parent: bytes | None) -> tuple[Handle[Reservation], list[Slot | None]]:
        """Allocate space for the keys not stored yet. Slot None means "already stored or being written"."""
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
        res = self.reservations.take(owner, rid).payload
        for entry in res.entries:
            entry.state = State.COMMITTED
        self.lru.add_chain(res.entries)
        c = self.counters
        c.puts += 1
        c.put_chunks += len(res.entries)
        c.put_bytes += sum(e.size for e in res.entries)
        return len(res.entries)

    def abort(self, owner: bytes, rid: int) -> int:
        res = self.reservations.take(owner, rid).payload
        self._drop_reserved(res.entries)
        return len(res.entries)

    # -- leased reads ---------------------------------------------------------------------------------------
    def get(self, owner: bytes, keys: Sequence[bytes]) -> tuple[Handle[list[Entry]] | None, list[Entry]]:
        """Pin the longest stored prefix of ``keys`` under a new lease (None when nothing is stored)."""
        found = self.leading(keys)
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

    # -- removal --------------------------------------------------------------------------------------------
    def delete(self, keys: Sequence[bytes]) -> int:
        deleted = 0
        for key in keys:
            entry = self.index.get(key)
            if entry is not None and entry.state is State.COMMITTED:
                self._remove_committed(entry)
                deleted += 1
        return deleted

    def clear(self) -> int:
        return self.delete([k for k, e in self.index.items() if e.state is State.COMMITTED])

    def expire(self) -> tuple[int, int]:
        """Release expired leases and abort expired reservations. Returns how many of each."""
        now = self.clock()
        leases = self.leases.pop_expired(now)
        for handle in leases:
            self._unpin_chain(handle.payload)
        reservations = self.reservations.pop_expired(now)
        for handle in reservations:
            self._drop_reserved(handle.payload.entries)
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
        return len(leases), len(reservations)

    def committed_chunks(self) -> int:
        return sum(1 for e in self.index.values() if e.state is State.COMMITTED)

    # -- internals: the one place each resource is taken and given back ---------------------------------------
    def _allocate(self, size: int) -> int:
        while True:
            offset = self.host.allocate(size)
            if offset is not None:
                return offset
            victim = self.lru.pop_oldest()
            if victim is None:
                raise StoreFullError(
                    f"host tier is full: no room for a {size}-byte chunk and every stored chunk is leased or "
                    f"being written ({self.host.used_bytes} of {self.host.capacity_bytes} bytes in use)")
            self._evict(victim)

    def _evict(self, entry: Entry) -> None:
        del self.index[entry.key]
        self._free(entry)
        self.counters.evictions += 1
        self.counters.evicted_bytes += entry.size

    def _free(self, entry: Entry) -> None:
        if entry.host_offset is not None:
            self.host.free(entry.host_offset)
            entry.host_offset = None

    def _drop_reserved(self, entries: list[Entry]) -> None:
        for entry in entries:
            if self.index.get(entry.key) is entry:
                del self.index[entry.key]
            self._free(entry)

    def _remove_committed(self, entry: Entry) -> None:
        del self.index[entry.key]
        self.lru.remove(entry)
        if entry.pins:
            entry.doomed = True
        else:
            self._free(entry)

    def _pin(self, entry: Entry) -> None:
        if entry.pins == 0:
            self.lru.remove(entry)
        entry.pins += 1

    def _unpin_chain(self, entries: list[Entry]) -> None:
        back_in_queue = []
        for entry in entries:
            entry.pins -= 1
            assert entry.pins >= 0, "unpinned more often than pinned"
            if entry.pins:
                continue
            if entry.doomed:
                self._free(entry)
            else:
                back_in_queue.append(entry)
        self.lru.add_chain(back_in_queue)
