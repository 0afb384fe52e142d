"""The two-phase put: ``Puts``, the collaborator the Store owns for it (``Store.puts``): reserve, commit, abort, and
the publish that a commit and a put into a credit (``credits.py``) share.

``reserve`` allocates DRAM for the keys not stored yet and inserts RESERVED entries that no reader can see; the
writer copies its bytes into the slots; ``commit`` makes them readable (``publish``), ``abort`` frees them. A
reservation carries a deadline, so space reserved by a writer that died is reclaimed by ``Store.expire``. A put
that finds no room says why (``host_full.py``).

``Puts`` owns the reservations and the checksummer hook (``sums``) and is given only what it uses: the plain
settings (reservation TTL, clock, the after-reply queue) and the Store's index, queues and slot primitives
(``PutStore``, which the Store fits). Each operation returns what it did (a handle and slots, chunks published).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from ..errors import ReservationError, StoreFullError
from ..protocol.engine_blocks import EngineBlocks
from ..protocol.retention import NORMAL, RetentionAsk
from .entry import Entry, State
from .handles import Handle, HandleTable
from .host_full import never_fits_message, over_ceiling_message
from .ledgers.base import TierLedger

if TYPE_CHECKING:
    from .after_reply import AfterReply
    from .classes import RetentionClasses
    from .kept import KeptCopies
    from .counters import StoreCounters
    from .credits import CreditBook
    from .eviction import EvictionQueue
    from ..tiers.host.tier import HostTier
    from .sinks import SumSink
    from .tenant_budgets import TenantBudgets


@dataclass(frozen=True)
class Slot:
    """Where a reserved or leased chunk lives in the host arena."""

    offset: int
    size: int


@dataclass
class Reservation:
    namespace: str
    entries: list[Entry]
    present: list[Entry] = field(default_factory=list)
    retention: RetentionAsk = NORMAL   # the class the put asked for (``protocol/retention.py``)


class PutStore(Protocol):
    """What a put uses of the Store: the index, the DRAM queue and tier, the ledgers to tell, and the one set of
    slot primitives."""

    @property
    def index(self) -> dict[bytes, Entry]: ...
    @property
    def lru(self) -> EvictionQueue: ...
    @property
    def ledgers(self) -> list[TierLedger]: ...
    @property
    def counters(self) -> StoreCounters: ...
    @property
    def credits(self) -> CreditBook: ...
    @property
    def host(self) -> HostTier: ...
    @property
    def budgets(self) -> TenantBudgets: ...
    @property
    def retention(self) -> RetentionClasses: ...
    @property
    def kept(self) -> KeptCopies: ...

    def allocate_host(self, size: int, owner: bytes | None = None, taken: Sequence[Entry] = (),
                      namespace: str | None = None) -> int: ...
    def charge_host(self, entry: Entry) -> None: ...
    def drop_reserved(self, entries: list[Entry]) -> None: ...
    def sync(self, key: bytes) -> None: ...
    def sync_many(self, keys: Sequence[bytes]) -> None: ...


class Puts:
    """The two-phase put of one Store (see the module docstring)."""

    def __init__(self, store: PutStore, reserve_ttl: float, clock: Callable[[], float],
                 after_reply: "AfterReply | None") -> None:
        """The puts into ``store``.

        Args:
            reserve_ttl: seconds a reservation lives unless committed or aborted.
            clock: the time reservations are measured on.
            after_reply: where a publish leaves the work no reader sees (None: done at once).
        """
        self.store = store
        self.reserve_ttl = reserve_ttl
        self.clock = clock
        self.after_reply = after_reply
        self.reservations: HandleTable[Reservation] = HandleTable("reservation", ReservationError)
        self.sums: SumSink | None = None   # set by the checksummer when it starts: commits go through it first

    def put_refusal(self) -> str:
        """Why every put fails now ("" when none need): a lower tier that cannot take what a put queues."""
        for ledger in self.store.ledgers:
            reason = ledger.refusal()
            if reason:
                return reason
        return ""

    def reserve(self, owner: bytes, namespace: str, keys: Sequence[bytes], sizes: Sequence[int],
                parent: bytes | None, credit: int = 0, engine: Sequence[EngineBlocks | None] | None = None,
                retention: RetentionAsk = NORMAL) -> tuple[Handle[Reservation], list[Slot | None]]:
        """Allocate space for the keys not stored yet. Slot None means "already stored or being written".

        ``credit``: a put credit the writer holds and offers (``credits.py``): when the room is short it is freed
        and the reserve tried once more, here, so that a writer whose own credit held the room needs no second
        request (and no error it would not see). ``engine``: per key, the engine's names of its blocks (kept on
        the new entries for the KV cache events). ``retention``: the class the chunks are kept in once committed
        (chunks stored already are raised to it now); not ``no-store``, which the caller answers itself
        (``RetentionClasses.count_no_store``). Raises StoreFullError when there is no room."""
        self.refuse_never_fitting(namespace, keys, sizes)
        counters = self.store.counters
        refusal = self.put_refusal()
        if refusal:
            counters.full_errors += 1
            raise StoreFullError(refusal)
        try:
            return self._reserve_slots(owner, namespace, keys, sizes, parent, engine, retention)
        except StoreFullError:
            if not (credit and self.store.credits.give_back(owner, credit)):
                counters.full_errors += 1
                raise
        try:
            return self._reserve_slots(owner, namespace, keys, sizes, parent, engine, retention)
        except StoreFullError:
            counters.full_errors += 1
            raise

    def refuse_never_fitting(self, namespace: str, keys: Sequence[bytes], sizes: Sequence[int]) -> None:
        """Refuse a put whose new chunks need more than the whole host tier, or more than its tenant's whole DRAM
        ceiling: making room for it would evict (or move down) every chunk that may leave and still fail, so it is
        refused before anything moves. Keys stored already need no room. Raises StoreFullError (counted) naming
        the bytes asked and the room there could ever be."""
        allocator = self.store.host.allocator
        budgets = self.store.budgets
        tenant = budgets.tenant_of(namespace) if budgets.held("dram") is not None else None
        ceiling = tenant.budget("dram").ceiling_bytes if tenant is not None else None
        total = sum(sizes)
        if total + allocator.align * len(sizes) <= allocator.capacity and (ceiling is None or total <= ceiling):
            return   # the common case, without a walk of the index (each slot rounds up to whole pages at most)
        fresh: dict[bytes, int] = {}
        for key, size in zip(keys, sizes):
            if key not in self.store.index:
                fresh.setdefault(key, size)
        asked = sum(fresh.values())
        message = ""
        if sum(allocator.units_for(size) for size in fresh.values()) * allocator.align > allocator.capacity:
            message = never_fits_message(asked, len(fresh), allocator.capacity)
        elif tenant is not None and ceiling is not None and asked > ceiling:
            message = over_ceiling_message(tenant.name, asked, len(fresh), ceiling)
        if message:
            self.store.counters.full_errors += 1
            raise StoreFullError(message)

    def _reserve_slots(self, owner: bytes, namespace: str, keys: Sequence[bytes], sizes: Sequence[int],
                       parent: bytes | None, engine: Sequence[EngineBlocks | None] | None = None,
                       retention: RetentionAsk = NORMAL) -> tuple[Handle[Reservation], list[Slot | None]]:
        """``reserve``'s allocations: all of them, or none (what was taken goes back) and StoreFullError."""
        store = self.store
        res = Reservation(namespace, [], retention=retention)
        slots: list[Slot | None] = []
        prev = parent
        try:
            for i, (key, size) in enumerate(zip(keys, sizes)):
                existing = store.index.get(key)
                if existing is not None:
                    if existing.readable:
                        res.present.append(existing)
                    slots.append(None)
                else:
                    entry = Entry(key, size, namespace, prev, State.RESERVED)
                    if engine is not None:
                        entry.engine = engine[i]
                    entry.host_offset = store.allocate_host(size, owner, res.entries, namespace)
                    store.charge_host(entry)
                    store.index[key] = entry
                    res.entries.append(entry)
                    slots.append(Slot(entry.host_offset, size))
                prev = key
        except StoreFullError:
            store.drop_reserved(res.entries)
            raise
        store.lru.touch_chain(res.present)
        if retention is not NORMAL:
            store.retention.apply(res.present, retention)
        handle = self.reservations.issue(owner, res, self.reserve_ttl, self.clock())
        return handle, slots

    def commit(self, owner: bytes, rid: int) -> int:
        """Make reservation ``rid`` of ``owner`` readable; returns the chunks published. Raises ReservationError
        when it is unknown (expired, aborted, or another owner's)."""
        res = self.reservations.take(owner, rid).payload
        return self.publish(res.entries, res.retention)

    def publish(self, entries: list[Entry], retention: RetentionAsk = NORMAL) -> int:
        """Make a reservation's written entries readable (a commit, or a put into a credit: ``credits.py``).
        What readers cannot see (the eviction queue, the checksum job, the counters) is left for after the reply
        where the daemon defers it (``after_reply.py``)."""
        for entry in entries:
            entry.state = State.COMMITTED
        self.store.sync_many([e.key for e in entries])
        if self.after_reply is not None:
            self.after_reply.add(lambda: self._file_published(entries, retention))
        else:
            self._file_published(entries, retention)
        return len(entries)

    def _file_published(self, entries: list[Entry], retention: RetentionAsk = NORMAL) -> None:
        """The rest of a publish: queue the chunks for eviction, take their sums, count the put. Only chunks
        still indexed are queued (nothing should have removed one since the publish, but a queue must never hold
        an unindexed chunk)."""
        store = self.store
        live = [e for e in entries if store.index.get(e.key) is e and e.readable]
        if retention is not NORMAL:
            store.retention.apply(live, retention, fresh=True)   # before queuing: each goes to its class's queue
        store.lru.add_chain(live)
        if self.sums is not None and live:
            self.sums.after_commit(live)   # then the ledgers hear of them, with their sums (``checksummed``)
        else:
            self.checksummed(live)
        c = store.counters
        c.puts += 1
        c.put_chunks += len(entries)
        c.put_bytes += sum(e.size for e in entries)

    def settle_after_reply(self) -> None:
        """Run what the last request left for after its reply (``after_reply.py``), if anything."""
        if self.after_reply is not None and len(self.after_reply):
            self.after_reply.run()

    def checksummed(self, entries: Sequence[Entry]) -> None:
        """Commit's checksums are known: every lower tier hears of the chunks still live (they carry the sum)."""
        store = self.store
        live = [e for e in entries if e.readable and store.index.get(e.key) is e and e.host_offset is not None]
        if live:
            store.kept.journal_commits(live)
            for ledger in store.ledgers:
                ledger.on_commit(live)

    def admit(self, entries: list[Entry], source: TierLedger) -> None:
        """Publish RESERVED entries a lower tier filled (``source``: the remote ledger's fetches), telling the
        other ledgers as a commit would; no put is counted."""
        store = self.store
        for entry in entries:
            entry.state = State.COMMITTED
            store.sync(entry.key)
        store.kept.journal_commits(entries)
        store.lru.add_chain(entries)
        if entries:
            for ledger in store.ledgers:
                if ledger is not source:
                    ledger.on_commit(entries)

    def abort(self, owner: bytes, rid: int) -> int:
        """Free reservation ``rid`` of ``owner``; returns its chunks. Raises ReservationError when unknown."""
        res = self.reservations.take(owner, rid).payload
        self.store.drop_reserved(res.entries)
        return len(res.entries)
