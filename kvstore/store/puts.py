"""The Store's two-phase put (a part of ``Store``, kept in its own file): reserve, commit, abort, and the publish
that a commit and a put into a credit (``credits.py``) share.

``reserve`` allocates DRAM for the keys not stored yet and inserts RESERVED entries that no reader can see; the
writer copies its bytes into the slots; ``commit`` makes them readable (``publish``), ``abort`` frees them. A
reservation carries a deadline, so space reserved by a writer that died is reclaimed by ``Store.expire``. A put
that finds no room says why (``host_full.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import StoreFullError
from ..protocol.engine_blocks import EngineBlocks
from ..protocol.retention import NORMAL, RetentionAsk
from .entry import Entry, State
from .handles import Handle
from .host_full import never_fits_message, over_ceiling_message
from .ledgers.base import TierLedger

if TYPE_CHECKING:
    from .after_reply import AfterReply
    from .counters import StoreCounters
    from .credits import CreditBook
    from .eviction import EvictionQueue
    from .handles import HandleTable
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


class PutMixin:
    """Methods of ``Store`` for the two-phase put (see the module docstring)."""

    # What the methods use of the Store (set by its constructor; declared for the type checker).
    index: dict[bytes, Entry]
    lru: EvictionQueue
    ledgers: list[TierLedger]
    reservations: HandleTable[Reservation]
    reserve_ttl: float
    clock: Callable[[], float]
    counters: StoreCounters
    credits: CreditBook
    sums: SumSink | None
    after_reply: AfterReply | None

    host: HostTier
    budgets: TenantBudgets

    if TYPE_CHECKING:
        def allocate_host(self, size: int, owner: bytes | None = None, taken: Sequence[Entry] = (),
                          namespace: str | None = None) -> int: ...
        def charge_host(self, entry: Entry) -> None: ...
        def drop_reserved(self, entries: list[Entry]) -> None: ...
        def sync(self, key: bytes) -> None: ...
        def sync_many(self, keys: Sequence[bytes]) -> None: ...
        def journal_commits(self, entries: Sequence[Entry]) -> None: ...
        def apply_retention(self, entries: Sequence[Entry], ask: RetentionAsk, fresh: bool = False) -> None: ...

    def put_refusal(self) -> str:
        """Why every put fails now ("" when none need): a lower tier that cannot take what a put queues."""
        for ledger in self.ledgers:
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
        (``count_no_store``). Raises StoreFullError when there is no room."""
        self.refuse_never_fitting(namespace, keys, sizes)
        refusal = self.put_refusal()
        if refusal:
            self.counters.full_errors += 1
            raise StoreFullError(refusal)
        try:
            return self._reserve_slots(owner, namespace, keys, sizes, parent, engine, retention)
        except StoreFullError:
            if not (credit and self.credits.give_back(owner, credit)):
                self.counters.full_errors += 1
                raise
        try:
            return self._reserve_slots(owner, namespace, keys, sizes, parent, engine, retention)
        except StoreFullError:
            self.counters.full_errors += 1
            raise

    def refuse_never_fitting(self, namespace: str, keys: Sequence[bytes], sizes: Sequence[int]) -> None:
        """Refuse a put whose new chunks need more than the whole host tier, or more than its tenant's whole DRAM
        ceiling: making room for it would evict (or move down) every chunk that may leave and still fail, so it is
        refused before anything moves. Keys stored already need no room. Raises StoreFullError (counted) naming
        the bytes asked and the room there could ever be."""
        allocator = self.host.allocator
        tenant = self.budgets.tenant_of(namespace) if self.budgets.held("dram") is not None else None
        ceiling = tenant.budget("dram").ceiling_bytes if tenant is not None else None
        total = sum(sizes)
        if total + allocator.align * len(sizes) <= allocator.capacity and (ceiling is None or total <= ceiling):
            return   # the common case, without a walk of the index (each slot rounds up to whole pages at most)
        fresh: dict[bytes, int] = {}
        for key, size in zip(keys, sizes):
            if key not in self.index:
                fresh.setdefault(key, size)
        asked = sum(fresh.values())
        message = ""
        if sum(allocator.units_for(size) for size in fresh.values()) * allocator.align > allocator.capacity:
            message = never_fits_message(asked, len(fresh), allocator.capacity)
        elif tenant is not None and ceiling is not None and asked > ceiling:
            message = over_ceiling_message(tenant.name, asked, len(fresh), ceiling)
        if message:
            self.counters.full_errors += 1
            raise StoreFullError(message)

    def _reserve_slots(self, owner: bytes, namespace: str, keys: Sequence[bytes], sizes: Sequence[int],
                       parent: bytes | None, engine: Sequence[EngineBlocks | None] | None = None,
                       retention: RetentionAsk = NORMAL) -> tuple[Handle[Reservation], list[Slot | None]]:
        """``reserve``'s allocations: all of them, or none (what was taken goes back) and StoreFullError."""
        res = Reservation(namespace, [], retention=retention)
        slots: list[Slot | None] = []
        prev = parent
        try:
            for i, (key, size) in enumerate(zip(keys, sizes)):
                existing = self.index.get(key)
                if existing is not None:
                    if existing.readable:
                        res.present.append(existing)
                    slots.append(None)
                else:
                    entry = Entry(key, size, namespace, prev, State.RESERVED)
                    if engine is not None:
                        entry.engine = engine[i]
                    entry.host_offset = self.allocate_host(size, owner, res.entries, namespace)
                    self.charge_host(entry)
                    self.index[key] = entry
                    res.entries.append(entry)
                    slots.append(Slot(entry.host_offset, size))
                prev = key
        except StoreFullError:
            self.drop_reserved(res.entries)
            raise
        self.lru.touch_chain(res.present)
        if retention is not NORMAL:
            self.apply_retention(res.present, retention)
        handle = self.reservations.issue(owner, res, self.reserve_ttl, self.clock())
        return handle, slots

    def commit(self, owner: bytes, rid: int) -> int:
        res = self.reservations.take(owner, rid).payload
        return self.publish(res.entries, res.retention)

    def publish(self, entries: list[Entry], retention: RetentionAsk = NORMAL) -> int:
        """Make a reservation's written entries readable (a commit, or a put into a credit: ``credits.py``).
        What readers cannot see (the eviction queue, the checksum job, the counters) is left for after the reply
        where the daemon defers it (``after_reply.py``)."""
        for entry in entries:
            entry.state = State.COMMITTED
        self.sync_many([e.key for e in entries])
        if self.after_reply is not None:
            self.after_reply.add(lambda: self._file_published(entries, retention))
        else:
            self._file_published(entries, retention)
        return len(entries)

    def _file_published(self, entries: list[Entry], retention: RetentionAsk = NORMAL) -> None:
        """The rest of a publish: queue the chunks for eviction, take their sums, count the put. Only chunks
        still indexed are queued (nothing should have removed one since the publish, but a queue must never hold
        an unindexed chunk)."""
        live = [e for e in entries if self.index.get(e.key) is e and e.readable]
        if retention is not NORMAL:
            self.apply_retention(live, retention, fresh=True)   # before they are queued: each goes to its class's queue
        self.lru.add_chain(live)
        if self.sums is not None and live:
            self.sums.after_commit(live)   # then the ledgers hear of them, with their sums (``checksummed``)
        else:
            self.checksummed(live)
        c = self.counters
        c.puts += 1
        c.put_chunks += len(entries)
        c.put_bytes += sum(e.size for e in entries)

    def settle_after_reply(self) -> None:
        """Run what the last request left for after its reply (``after_reply.py``), if anything."""
        if self.after_reply is not None and len(self.after_reply):
            self.after_reply.run()

    def checksummed(self, entries: Sequence[Entry]) -> None:
        """Commit's checksums are known: every lower tier hears of the chunks still live (they carry the sum)."""
        live = [e for e in entries if e.readable and self.index.get(e.key) is e and e.host_offset is not None]
        if live:
            self.journal_commits(live)
            for ledger in self.ledgers:
                ledger.on_commit(live)

    def admit(self, entries: list[Entry], source: TierLedger) -> None:
        """Publish RESERVED entries a lower tier filled (``source``: the remote ledger's fetches), telling the
        other ledgers as a commit would; no put is counted."""
        for entry in entries:
            entry.state = State.COMMITTED
            self.sync(entry.key)
        self.journal_commits(entries)
        self.lru.add_chain(entries)
        if entries:
            for ledger in self.ledgers:
                if ledger is not source:
                    ledger.on_commit(entries)

    def abort(self, owner: bytes, rid: int) -> int:
        res = self.reservations.take(owner, rid).payload
        self.drop_reserved(res.entries)
        return len(res.entries)
