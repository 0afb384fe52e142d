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

Tiers below DRAM are each a ledger and a mover (``ledgers/base.py`` says how): the Store calls every ledger's hooks
and never a mover. Leaving DRAM is a *demotion* when some ledger ``keeps`` the chunk and an eviction otherwise; a
slot whose I/O a ledger ``uses_dram`` stays (with its place in the host LRU) until that I/O ends.

Collaborators the Store owns, each given only what it uses and owning its own state: the two-phase put and its
reservations (``puts.py``, ``Store.puts``; ``reserve``, ``commit`` and ``abort`` answer the wire through it), the
damage path (``damage.py``, ``Store.damage``), retention classes and soft pins (``classes.py``,
``Store.retention``), the warm restart's side (``kept.py``, ``Store.kept``: journal, adoption of kept copies) and
the shared index and events (``publishing.py``, ``Store.publishing``; ``sync`` and ``sync_many`` are its). It
builds the ledgers too (``ledgers/builder.py``). A full host tier's message: ``host_full.py``; counters:
``counters.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import takewhile
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import LeaseError, StoreFullError
from ..protocol.key_params import KeyParams
from ..tiers.disk.tier import DiskTier
from ..tiers.host.tier import HostTier
from .after_reply import AfterReply
from .classes import DEFAULT_PINS, PinSettings, RetentionClasses
from .counters import StoreCounters, TierCounters
from .credits import CreditBook
from .damage import Damage
from .entry import Entry, State
from .handles import Handle, HandleTable
from .host_full import count_holders, host_full_message
from .kept import KeptCopies
from .ledgers.base import TierLedger
from .publishing import Publishing, top_tier
from .puts import Puts, Slot
from .room import make_room
from .s3fifo import MAX_FREQ
from .sinks import EventSink, IndexSink
from .tenant_budgets import TenantBudgets
from .tier_guard import TierGuard

if TYPE_CHECKING:
    from ..tiers.gpu.tier import GpuTier
    from .ledgers.builder import TierSpecs
    from ..tenants.table import TenantTable


@dataclass(frozen=True)
class LookupResult:
    count: int
    tiers: list[str]


class Store:
    def __init__(self, host: HostTier, lease_ttl: float, reserve_ttl: float, lower: "TierSpecs",
                 clock: Callable[[], float] = time.monotonic, tenants: "TenantTable | None" = None, *,
                 after_reply: AfterReply | None = None, private: Callable[[str], bool] | None = None,
                 events: EventSink | None = None, published: IndexSink | None = None,
                 pins: PinSettings = DEFAULT_PINS) -> None:
        """The index over ``host`` (the DRAM tier) and the tiers below it, named by ``lower``
        (``store/ledgers/builder.py``), whose ledgers it builds: each is handed, at construction, the protocol of
        the Store it uses (``DiskStore``, ``FillStore``, ``RemoteStore``), and nothing later.

        Args:
            lease_ttl: seconds a lease holds its chunks unless extended.
            reserve_ttl: seconds a reservation (or a credit) lives unless used.
            lower: the tiers below DRAM (``tier_ledgers``), and the eviction policy of every tier's queue.
            clock: the time leases and reservations are measured on.
            tenants: the tenants table whose budgets apply (held in DRAM, disk and GPU); None: one shared tenant.
            after_reply: where a put leaves the work no reader sees, to run after its reply (the daemon's).
            private: whether a namespace is kept out of the shared index (a restricted tenant's).
            events: the KV cache event sink, when the daemon publishes events.
            published: the shared lookup index, when the daemon publishes one.
            pins: the bounds of soft pins (retention class ``pin``).
        """
        self.host = host
        self.disk: DiskTier | None = lower.disk
        self.gpu: "GpuTier | None" = lower.gpu
        self.policy = lower.policy         # eviction order of every tier (policies.py)
        self.lease_ttl = lease_ttl
        self.reserve_ttl = reserve_ttl
        self.clock = clock
        self.index: dict[bytes, Entry] = {}
        # How each namespace's clients make keys (server/requests/compat.py checks them at hello): written into every
        # record of a chunk (kept arena, journal, disk header) and filled in from those a restart finds.
        self.key_params: dict[str, KeyParams] = {}
        # Each tenant's bytes in every tier, and the queues that hold its guarantee (tenant_budgets.py).
        self.budgets = TenantBudgets(tenants, self.policy)
        self.lru = self.budgets.queue("dram")
        self.leases: HandleTable[list[Entry]] = HandleTable("lease", LeaseError)
        self.counters = StoreCounters()
        self.tier_counters = TierCounters()
        self.publishing = Publishing(self.index, private, events, published)   # the shared index and events
        self.sync, self.sync_many = self.publishing.sync, self.publishing.sync_many
        self.after_reply = after_reply
        # Retention classes and soft pins, before the ledgers: the disk ledger's rebuild may split the queues.
        self.retention = RetentionClasses(self, self.budgets, self.policy, host.capacity_bytes, clock, pins)
        self.kept = KeptCopies(self)   # a warm restart: the journal of DRAM copies, the adoption of kept ones
        ledgers = lower.build(self)   # after the budgets, which each ledger takes its queue from
        self.disk_ledger = ledgers.disk
        self.gpu_ledger = ledgers.gpu
        self.remote_ledger = ledgers.remote
        self.ledgers: list[TierLedger] = ledgers.in_hook_order()
        self.damage = Damage(self, ledgers.disk, ledgers.gpu)   # damaged copies: repaired, or dropped with their chain
        self.puts = Puts(self, reserve_ttl, clock, after_reply)   # the two-phase put, and the reservations
        # The wire's put operations, answered by the put path.
        self.reserve, self.commit, self.abort = self.puts.reserve, self.puts.commit, self.puts.abort
        self.credits = CreditBook(self)   # free arena space lent to writers, so a put needs no RESERVE

    def set_tenants(self, table: "TenantTable") -> None:
        """Apply a (re)loaded tenants table at once; chunks are charged again, in every tier, to the tenants it
        names, and every tier's queue follows its new budgets."""
        self.budgets.replace(table, list(self.index.values()))
        self.queues_changed()
        self.retention.soft_pins.recount(self.index.values())

    def queues_changed(self) -> None:
        """Every tier's queue was replaced (new budgets, or queues split by class): each takes its own again."""
        self.lru = self.budgets.queue("dram")
        for ledger in self.ledgers:
            ledger.budgets_changed()

    def charge_host(self, entry: Entry) -> None:
        """``entry`` now holds a DRAM slot: its bytes count against its tenant's budget."""
        self.budgets.charge(entry)

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

    def note_lookup(self, asked: int, found_keys: Sequence[bytes], repeat: int = 1) -> None:
        """``repeat`` lookups a client answered from the shared index alike (``found_keys`` leading keys of
        ``asked``): touch the chain, or what is left of it, and count them as ``lookup`` would have. Touching a
        chain again changes no queue past MAX_FREQ touches (LRU moves it where it already is; S3-FIFO's counts
        stop there), so the touches stop there too."""
        found = self.leading(found_keys)
        for _ in range(min(repeat, MAX_FREQ) - 1):
            self.lru.touch_chain(found)
            for ledger in self.ledgers:
                ledger.on_touch(found)
        self._touch_looked_up(found, asked, len(found_keys), repeat)

    def count_remote_hits(self, chunks: int) -> None:
        """A lookup found ``chunks`` more in the remote store (or being fetched from it) past its local walk."""
        self.counters.hit_keys += chunks

    def note_read(self, keys: Sequence[bytes]) -> None:
        """A get a local client copied out of the arena itself (``client/arena_read.py``): touched and counted
        as ``get`` would (its pin and unpin move the chain to the newest end of the queues)."""
        found = list(takewhile(lambda e: e.host_offset is not None, self.leading(keys)))
        self.lru.touch_chain(found)
        for ledger in self.ledgers:
            ledger.on_touch(found)
        self._count_get(found)

    def _count_get(self, found: list[Entry]) -> None:
        for ledger in self.ledgers:
            ledger.on_hit(found)
        c = self.counters
        c.gets += 1
        c.get_chunks += len(found)
        c.get_bytes += sum(e.size for e in found)

    def _touch_looked_up(self, found: list[Entry], asked: int, hits: int, lookups: int = 1) -> None:
        self.lru.touch_chain(found)
        for ledger in self.ledgers:
            ledger.on_touch(found)
        c = self.counters
        c.lookups += lookups
        c.lookup_keys += asked * lookups
        c.hit_keys += hits * lookups

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
            self.pin(entry)
        return self.leases.issue(owner, found, self.lease_ttl, self.clock()), found

    def release(self, owner: bytes, lease_id: int) -> int:
        entries = self.leases.take(owner, lease_id).payload
        self.unpin_chain(entries)
        return len(entries)

    def extend(self, owner: bytes, lease_id: int) -> float:
        handle = self.leases.extend(owner, lease_id, self.clock())
        return handle.deadline - self.clock()

    def read(self, entry: Entry) -> memoryview:
        """The DRAM bytes of a chunk the caller holds a lease or reservation on."""
        assert entry.host_offset is not None
        return self.host.read(entry.host_offset, entry.size)

    def write(self, slot: Slot, data: bytes | memoryview) -> None:
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
                self.remove_committed(entry)
                deleted += 1
        return deleted

    def clear(self, namespace: str) -> int:
        """Delete every committed chunk of ``namespace`` (and only those: other namespaces are other engines').
        When they are all the Store holds, the event sink hears of one clear rather than of each chunk."""
        keys = [k for k, e in self.index.items() if e.state is State.COMMITTED and e.namespace == namespace]
        if self.publishing.events is not None and keys and all(e.namespace == namespace for e in self.index.values()
                                                    if e.readable):
            self.publishing.events.all_cleared()
        return self.delete(keys)

    def expire(self, keep_leases_of: Callable[[bytes], bool] | None = None) -> tuple[int, int]:
        """Release expired leases (but those of owners ``keep_leases_of`` spares, ``handles.py``) and abort expired
        reservations. Returns how many of each."""
        now = self.clock()
        leases = self.leases.pop_expired(now, keep_leases_of)
        for lease in leases:
            self.unpin_chain(lease.payload)
        reservations = self.puts.reservations.pop_expired(now)
        for reservation in reservations:
            self.drop_reserved(reservation.payload.entries)
        self.credits.expire(now, keep_leases_of)
        self.retention.expire_pins()   # pins past their TTL become high, with or without pressure
        self.counters.expired_leases += len(leases)
        self.counters.expired_reservations += len(reservations)
        return len(leases), len(reservations)

    def drop_owner(self, owner: bytes) -> tuple[int, int]:
        """A client is gone: release its leases and abort its reservations now."""
        leases = self.leases.pop_owner(owner)
        for lease in leases:
            self.unpin_chain(lease.payload)
        reservations = self.puts.reservations.pop_owner(owner)
        for reservation in reservations:
            self.drop_reserved(reservation.payload.entries)
        self.credits.drop_owner(owner)
        return len(leases), len(reservations)

    def committed_chunks(self) -> int:
        return sum(1 for e in self.index.values() if e.state is State.COMMITTED)

    # -- the one place each resource is taken and given back (ledgers call these too) ---------------------------
    def namespace_of(self, key: bytes) -> str | None:
        """The namespace of the chunk held under ``key`` (None: none is held)."""
        entry = self.index.get(key)
        return entry.namespace if entry is not None else None

    def allocate_host(self, size: int, owner: bytes | None = None, taken: Sequence[Entry] = (),
                      namespace: str | None = None) -> int:
        """A DRAM slot, evicting (or demoting) the oldest unpinned chunks until one fits. A chunk whose slot a
        lower tier's I/O uses, or a check reads, keeps its slot (and its place in the queue). ``owner`` and
        ``taken`` (what its request reserved so far) let a StoreFullError say who holds the room. With tenants,
        ``namespace`` names the tenant the slot is for: it is held to its ceiling, and no other tenant's
        guaranteed bytes leave for it (``tenant_budgets.py``). Pins past their TTL end first."""
        if self.retention.split:
            self.retention.expire_pins()
        guard = self.budgets.held("dram")
        if guard is None:
            offset = make_room(lambda: self.host.allocate(size), self.lru, self._may_leave_dram,
                               self.drop_host_copy)
            return self._allocated(offset, size, owner, taken)
        tenant = self._held_to_ceiling(guard, namespace, size) if namespace is not None else None
        offset = guard.make_room(tenant, lambda: self.host.allocate(size), self._may_leave_dram,
                                 self.drop_host_copy)
        return self._allocated(offset, size, owner, taken)

    def hold_to_ceiling(self, namespace: str, size: int) -> None:
        """Make ``size`` more bytes of ``namespace``'s tenant fit under its DRAM ceiling, evicting its own chunks
        (lowest retention class, then oldest, first): what a put into space already allocated (a put credit's,
        ``credits.py``) takes instead of ``allocate_host``. Raises StoreFullError, naming the tenant and its
        budget, when its chunks that may leave cannot make the room (those evicted so far stay evicted)."""
        guard = self.budgets.held("dram")
        if guard is None or size <= 0:
            return
        if self.retention.split:
            self.retention.expire_pins()
        self._held_to_ceiling(guard, namespace, size)

    def _held_to_ceiling(self, guard: TierGuard, namespace: str, size: int) -> str:
        """``hold_to_ceiling`` once the guard is known; returns the tenant's name."""
        tenant = self.budgets.tenant_of(namespace)
        if not guard.keep_under_ceiling(tenant.name, size, self._may_leave_dram, self.drop_host_copy):
            raise StoreFullError(self.budgets.ceiling_message(tenant, size))
        return tenant.name

    def _allocated(self, offset: int | None, size: int, owner: bytes | None, taken: Sequence[Entry]) -> int:
        """``offset``, or the StoreFullError that says what holds the room."""
        if offset is None:
            held = count_holders(self, owner, taken, self._may_leave_dram)
            raise StoreFullError(host_full_message(self.host.capacity_bytes, size, held))
        return offset

    def _may_leave_dram(self, entry: Entry) -> bool:
        """Whether nothing but the index uses the chunk's DRAM slot (a lower tier's I/O or a check reads it)."""
        return not entry.checking and not any(ledger.uses_dram(entry) for ledger in self.ledgers)

    def fill_host(self, entry: Entry, offset: int, evictable: bool = True) -> None:
        """A lower tier filled a DRAM slot with ``entry``'s bytes (a promotion, a copy down): publish it."""
        entry.host_offset = offset
        self.charge_host(entry)
        self.sync(entry.key)
        self.kept.journal_commits([entry])
        if evictable:
            self.lru.add_chain([entry])

    def drop_host_copy(self, entry: Entry) -> None:
        """An unpinned chunk leaves DRAM (it is already out of the host LRU): demoted if a lower tier keeps it,
        else evicted."""
        kept = any(ledger.keeps(entry) for ledger in self.ledgers)
        for ledger in self.ledgers:
            ledger.on_leave_dram(entry, kept)
        if kept:
            self.free_host(entry)
            return
        self.tier_counters.evictions_host += 1
        self._evict(entry)

    def unindex(self, entry: Entry) -> None:
        """``entry`` leaves the index and every tier's queues (what it holds is freed by the caller)."""
        del self.index[entry.key]
        self.sync(entry.key)
        self.lru.remove(entry)
        for ledger in self.ledgers:
            ledger.on_remove(entry)

    def lost(self, entry: Entry) -> None:
        """The last copy of an idle chunk went (a lower tier evicted it): it leaves the index."""
        self.unindex(entry)
        self.counters.evictions += 1
        self.counters.evicted_bytes += entry.size

    def _evict(self, entry: Entry) -> None:
        self.lost(entry)
        self._free(entry)

    def release_if_idle(self, entry: Entry) -> None:
        """Free what a removed (doomed) chunk still holds, once nothing uses it any more."""
        if entry.busy:
            return
        self._free(entry)

    def _free(self, entry: Entry) -> None:
        self.free_host(entry)
        for ledger in self.ledgers:
            ledger.on_free(entry)

    def free_host(self, entry: Entry) -> None:
        self.retention.unpin(entry)   # a pin holds a DRAM copy, or nothing
        if entry.host_offset is not None:
            self.host.free(entry.host_offset)
            entry.host_offset = None
            self.budgets.discharge(entry)
            self.sync(entry.key)

    def drop_reserved(self, entries: list[Entry]) -> None:
        for entry in entries:
            if self.index.get(entry.key) is entry:
                del self.index[entry.key]
            self._free(entry)

    def remove_committed(self, entry: Entry) -> None:
        """A committed chunk is deleted (or dropped as damaged): out of the index now, freed once idle."""
        self.unindex(entry)
        entry.doomed = True
        if entry.host_offset is not None and self.host.journal is not None:
            self.host.journal.forget(entry.host_offset)   # gone now, even while a reader still holds its slot
        self.release_if_idle(entry)

    def pin(self, entry: Entry) -> None:
        """A lease (or a put to the remote store) holds the chunk: out of every eviction queue until unpinned."""
        if entry.pins == 0:
            self.lru.remove(entry)
            for ledger in self.ledgers:
                ledger.on_pin(entry)
        entry.pins += 1

    def unpin_chain(self, entries: list[Entry]) -> None:
        back_in_queue = []
        for entry in entries:
            entry.pins -= 1
            assert entry.pins >= 0, "unpinned more often than pinned"
            if entry.pins:
                continue
            if entry.doomed:
                self.release_if_idle(entry)
            else:
                back_in_queue.append(entry)
        self.lru.add_chain([e for e in back_in_queue if e.host_offset is not None])
        for ledger in self.ledgers:
            ledger.on_unpin(back_in_queue)


if TYPE_CHECKING:
    from .credits import Store as CreditStore

    def _implements_credit_store(store: Store) -> CreditStore:
        return store   # the type checker proves that a Store is what its credit book uses
