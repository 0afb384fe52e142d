"""Put credits: free arena space lent to one writer, so that a put costs one round trip instead of two.

The two-phase put (``Store.reserve`` → the writer copies → ``Store.commit``) costs a round trip for the reserve
before any byte moves. A credit moves that round trip off the put's path: the daemon lends a writer one extent of
free host arena (a *credit*: a handle with the usual owner and deadline, ``handles.py``), the writer lays its
chunks out in it at page-aligned offsets of its choosing, copies them in, and sends one ``CREDIT_PUT`` naming
(key, offset, size) per chunk. The daemon checks every offset and size against the credit it lent (in order,
aligned, inside it, not overlapping: nothing from the wire is trusted), carves each chunk's slot out of the
extent (``ExtentAllocator.split``: the slot becomes an extent of its own, freed on its own later), publishes the
chunks through the same ``Store.publish`` a commit uses (so the index, the eviction order, checksums,
write-back and the remote put see them exactly as they see committed reservations), and lends the rest of the
extent back in the same reply — or, when the rest is smaller than the writer asked for, frees it and lends a
fresh extent. Steady-state puts therefore cost one round trip.

What readers see: nothing of a credit until its chunks are published, since no index entry points into it; a
slot in a credit was free space, so no reader can hold a view of it (chunks are freed only by their last unpin),
and a reused slot is never read as the old chunk. A key already stored (or being written by someone else) is
skipped: its slot goes straight back to the free space, as ``reserve`` skips it.

Trade-offs. Lent space is taken from the free space (watermarks count it; the stats report it apart from the
chunks, as ``credits.lent_bytes``) but holds no chunk: one credit holds at most 1/32 of the host tier and all
credits together at most 1/8, past which writers fall back to reserve + commit (small enough that a cache full of
chunks loses little: a lent credit is space evicted one put ahead). A credit is taken back when its owner goes
(stream closed, process dead: ``drop_owner``) or at its deadline (the reservation TTL), except — as for leases —
while its owner is a local process the daemon follows and finds alive, since that writer may be copying into it.
Lending may evict, as a reserve does: the space is taken when it is lent, one put ahead. A writer keeps one credit
and the same id for as long as it is lent (the deadline is extended on each put), so a put issues no new handle
id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from ..errors import BadRequestError, ReservationError, StoreFullError
from ..protocol.engine_blocks import EngineBlocks
from ..protocol.retention import NORMAL, RetentionAsk
from .entry import Entry, State
from .handles import Handle, HandleTable

if TYPE_CHECKING:
    from ..tiers.host.tier import HostTier
    from .classes import RetentionClasses
    from .counters import StoreCounters
    from .eviction import EvictionQueue


class PutPath(Protocol):
    """What a put into a credit uses of the Store's put path (``puts.Puts``)."""

    def put_refusal(self) -> str: ...
    def refuse_never_fitting(self, namespace: str, keys: Sequence[bytes], sizes: Sequence[int]) -> None: ...
    def publish(self, entries: list[Entry], retention: RetentionAsk = NORMAL) -> int: ...


class Store(Protocol):
    """What the credit book uses of the Store (a protocol rather than an import: store.py imports this module)."""

    host: HostTier
    index: dict[bytes, Entry]
    lru: EvictionQueue
    counters: StoreCounters
    reserve_ttl: float
    clock: Callable[[], float]

    @property
    def retention(self) -> RetentionClasses: ...   # the classes chunks stored again are raised to
    @property
    def puts(self) -> "PutPath": ...   # the refusals and the publish a put into a credit shares
    def charge_host(self, entry: Entry) -> None: ...
    def allocate_host(self, size: int, owner: bytes | None = None, taken: Sequence[Entry] = (),
                      namespace: str | None = None) -> int: ...
    def hold_to_ceiling(self, namespace: str, size: int) -> None: ...


ONE_CREDIT_SHARE = 32   # a credit holds at most 1/32 of the host tier
ALL_CREDITS_SHARE = 8   # all credits together at most 1/8


@dataclass
class Credit:
    """An extent of the host arena lent to one writer (byte offset and size, both page-aligned)."""

    offset: int
    size: int


@dataclass(frozen=True)
class Grant:
    """What the writer is told of the credit it holds after a request (id 0: none)."""

    id: int
    offset: int = 0
    size: int = 0
    ttl: float = 0.0

    def wire(self) -> dict[str, float | int]:
        return {"credit": self.id, "offset": self.offset, "size": self.size, "ttl": self.ttl}


@dataclass
class CreditCounters:
    lent: int = 0          # credits lent afresh (an extent allocated for a writer)
    puts: int = 0          # puts committed from a credit
    expired: int = 0       # credits taken back at their deadline
    refused: int = 0       # writers asking for a credit that got none (space or the 1/8 share)


class CreditBook:
    """The credits the Store has lent; all their space is owned here until carved into chunks or freed."""

    def __init__(self, store: "Store") -> None:
        self.store = store
        self.table: HandleTable[Credit] = HandleTable("credit", ReservationError)
        self.lent_bytes = 0
        self.counters = CreditCounters()

    def __len__(self) -> int:
        return len(self.table)

    @property
    def largest(self) -> int:
        """The most one credit holds."""
        return self.store.host.capacity_bytes // ONE_CREDIT_SHARE

    def put(self, owner: bytes, namespace: str, credit_id: int, keys: Sequence[bytes], offsets: Sequence[int],
            sizes: Sequence[int], parent: bytes | None, want: int,
            engine: Sequence[EngineBlocks | None] | None = None,
            retention: RetentionAsk = NORMAL) -> tuple[int, Grant]:
        """Publish the chunks written into the owner's credit ``credit_id`` and lend ``want`` bytes again.
        ``retention``: the class the chunks are kept in (``Store.reserve`` says how).
        ``credit_id`` 0 with no keys asks for a first credit. Returns (chunks committed, the credit now held).
        Nothing changes when the request is refused, except at the tenant's DRAM ceiling: the put is held to it
        as a reserve is (``Store.hold_to_ceiling``: its own chunks leave first), and when they cannot make the room
        it is refused with StoreFullError and the credit goes back to the free space (the writer forgot it when
        it sent the put)."""
        store = self.store
        handle = self.table.peek(owner, credit_id) if credit_id else None
        if keys:
            if handle is None:
                raise BadRequestError("CREDIT_PUT names chunks but no credit; take one first (credit 0, no keys)")
            refusal = store.puts.put_refusal()
            if refusal:
                store.counters.full_errors += 1
                raise StoreFullError(refusal)
            self._check_layout(handle.payload, offsets, sizes)
            self._refuse_never_fitting(owner, handle, namespace, keys, sizes)
            self._hold_to_ceiling(owner, handle, namespace, keys, sizes)
        self._drop_others(owner, credit_id)
        committed, rest = 0, None
        if handle is not None:
            self.lent_bytes -= handle.payload.size
            committed, rest = self._carve(handle.payload, namespace, keys, offsets, sizes, parent, engine,
                                          retention)
        return committed, self._lend(owner, handle, rest, want)

    def give_back(self, owner: bytes, credit_id: int) -> bool:
        """Free the owner's credit ``credit_id`` (a reserve that found no room offered it); False when the owner
        holds no such credit."""
        if credit_id not in self.table.ids_of(owner):
            return False
        self._free(self.table.take(owner, credit_id).payload)
        return True

    def holds(self, owner: bytes, credit_id: int) -> bool:
        return credit_id in self.table.ids_of(owner)

    def expire(self, now: float, keep: Callable[[bytes], bool] | None) -> int:
        gone = self.table.pop_expired(now, keep)
        for handle in gone:
            self._free(handle.payload)
        self.counters.expired += len(gone)
        return len(gone)

    def drop_owner(self, owner: bytes) -> int:
        gone = self.table.pop_owner(owner)
        for handle in gone:
            self._free(handle.payload)
        return len(gone)

    def stats(self) -> dict[str, int]:
        return {"active": len(self.table), "lent_bytes": self.lent_bytes, **self.counters.__dict__}

    # -- internals ---------------------------------------------------------------------------------------------
    def _drop_others(self, owner: bytes, credit_id: int) -> None:
        """A writer holds one credit: one it does not name is one it has forgotten (a reply it never read)."""
        for hid in list(self.table.ids_of(owner)):
            if hid != credit_id:
                self._free(self.table.take(owner, hid).payload)

    def _refuse_never_fitting(self, owner: bytes, handle: Handle[Credit], namespace: str, keys: Sequence[bytes],
                              sizes: Sequence[int]) -> None:
        """A put more than its tenant's whole DRAM ceiling is refused before any chunk of the tenant leaves
        (``Puts.refuse_never_fitting``); its credit goes back to the free space, as at the ceiling."""
        try:
            self.store.puts.refuse_never_fitting(namespace, keys, sizes)
        except StoreFullError:
            self._free(self.table.take(owner, handle.id).payload)
            raise

    def _hold_to_ceiling(self, owner: bytes, handle: Handle[Credit], namespace: str, keys: Sequence[bytes],
                         sizes: Sequence[int]) -> None:
        """Hold the put's tenant to its DRAM ceiling for the chunks it stores anew (the credit's space was lent,
        charged to nobody, so the lending held no tenant to anything). Its own chunks that leave may include
        ones this put names, which it then stores anew: counted again until nothing more is needed. Refused:
        the credit is freed and StoreFullError raised."""
        store = self.store
        held = 0
        try:
            while True:
                fresh = _fresh_bytes(store.index, keys, sizes)
                if fresh <= held:
                    return
                store.hold_to_ceiling(namespace, fresh)
                held = fresh
        except StoreFullError:
            store.counters.full_errors += 1
            self._free(self.table.take(owner, handle.id).payload)
            raise

    def _check_layout(self, credit: Credit, offsets: Sequence[int], sizes: Sequence[int]) -> None:
        """Every chunk page-aligned, inside the credit, after the one before it: the wire is never trusted."""
        align = self.store.host.allocator.align
        floor, limit = credit.offset, credit.offset + credit.size
        for i, (offset, size) in enumerate(zip(offsets, sizes)):
            end = offset + _round_up(size, align)
            if offset % align or offset < floor or end > limit:
                raise BadRequestError(
                    f"chunk {i} at offsets [{offset}, {offset + size}) is not a {align}-aligned slot inside the "
                    f"credit [{credit.offset}, {limit}) after chunk {i - 1}; lay chunks out in order in the credit")
            floor = end

    def _carve(self, credit: Credit, namespace: str, keys: Sequence[bytes], offsets: Sequence[int],
               sizes: Sequence[int], parent: bytes | None,
               engine: Sequence[EngineBlocks | None] | None,
               retention: RetentionAsk = NORMAL) -> tuple[int, Credit | None]:
        """Cut each chunk's slot out of the credit's extent and publish the chunks; the gaps between them go
        back to the free space. Returns (chunks committed, what is left of the extent past the last one)."""
        store, host = self.store, self.store.host
        align = host.allocator.align
        cursor, limit = credit.offset, credit.offset + credit.size   # the extent at cursor is still the credit's
        entries: list[Entry] = []
        present: list[Entry] = []
        prev = parent
        for i, (key, offset, size) in enumerate(zip(keys, offsets, sizes)):
            if offset > cursor:
                host.split(cursor, offset)
                host.free(cursor)
            cursor = offset + _round_up(size, align)
            if cursor < limit:
                host.split(offset, cursor)
            existing = store.index.get(key)
            if existing is None:
                entry = Entry(key, size, namespace, prev, State.RESERVED, host_offset=offset,
                              engine=engine[i] if engine is not None else None)
                store.charge_host(entry)
                store.index[key] = entry
                entries.append(entry)
            else:   # stored already, or being written by another: skipped, as reserve skips it
                host.free(offset)
                if existing.readable:
                    present.append(existing)
            prev = key
        store.lru.touch_chain(present)
        if retention is not NORMAL:
            store.retention.apply(present, retention)
        committed = store.puts.publish(entries, retention) if keys else 0
        if keys:
            self.counters.puts += 1
        return committed, (Credit(cursor, limit - cursor) if cursor < limit else None)

    def _lend(self, owner: bytes, handle: Handle[Credit] | None, rest: Credit | None, want: int) -> Grant:
        """Lend ``rest`` again when it holds ``want`` bytes, else a fresh extent (freeing ``rest``); none when
        neither can be had. The writer keeps its credit id."""
        store = self.store
        want = min(want, self.largest)
        if rest is not None and rest.size < want:
            self._free(rest, lent=False)
            rest = None
        if rest is None and want > 0:
            rest = self._allocate(want)
        if rest is None:
            if handle is not None:
                self.table.take(owner, handle.id)
            return Grant(0)
        self.lent_bytes += rest.size
        now = store.clock()
        if handle is None:
            handle = self.table.issue(owner, rest, store.reserve_ttl, now)
        else:
            handle.payload = rest
            self.table.extend(owner, handle.id, now)
        return Grant(handle.id, rest.offset, rest.size, store.reserve_ttl)

    def _allocate(self, want: int) -> Credit | None:
        host = self.store.host
        if self.lent_bytes + want > host.capacity_bytes // ALL_CREDITS_SHARE:
            self.counters.refused += 1
            return None
        try:
            offset = self.store.allocate_host(want)   # evicts as a reserve would: the space is taken one put ahead
        except StoreFullError:
            self.counters.refused += 1
            return None
        self.counters.lent += 1
        return Credit(offset, host.allocator.size_of(offset))

    def _free(self, credit: Credit, lent: bool = True) -> None:
        self.store.host.free(credit.offset)
        if lent:
            self.lent_bytes -= credit.size


def _fresh_bytes(index: dict[bytes, Entry], keys: Sequence[bytes], sizes: Sequence[int]) -> int:
    """The bytes of the chunks a put stores anew: keys not indexed, each counted once."""
    seen: set[bytes] = set()
    fresh = 0
    for key, size in zip(keys, sizes):
        if key not in seen and key not in index:
            fresh += size
        seen.add(key)
    return fresh


def _round_up(size: int, align: int) -> int:
    return -(-size // align) * align
