"""One tier's bytes per tenant, and its eviction queue split so that no tenant's guarantee is ever a victim.

Every tier with a queue (DRAM: the Store; disk and GPU: their ledgers) has one ``TierGuard``. It keeps each
tenant's bytes in the tier (``use``: charged when a chunk takes the tier's space, given back when it frees it)
and, once a tenants table gives some tenant a budget there, it stands in for the tier's eviction queue: it has
the ``EvictionQueue`` interface, over queues of the tier's own policy, and never looks inside them.

Parking. Of a budgeted tenant T's evictable chunks, only its *spilled* ones are in the *shared* queue (with
every chunk of the tenants without a budget); the others are *parked* in T's own queue, out of the shared order.
The guard keeps, after every operation, the invariant

    spilled bytes of T  ≤  max(0, use[T] − guaranteed[T])

so evicting any chunk of the shared queue leaves its tenant at or above its guarantee: choosing a victim is one
pop, whatever the number of protected chunks (before, an allocation set every protected chunk older than its
victim aside, one by one). ``_settle`` restores the invariant after each change, moving one chunk per step: when
T's use grows, its parked queue's next victims spill into the shared queue at its newest end, and compete there
like anyone's chunks from then on; when T's use falls, its newest spilled chunks go back to the old end of its
parked queue. A tenant with a ceiling and no guarantee spills every chunk at once (its slack is all it holds).

Own queue. ``own(T)`` hands out T's chunks, its spilled ones first (oldest spilled first) and then its parked
ones in its queue's order: what T's ceiling evicts, and what T's own allocation takes last (a tenant's
guarantee is kept from others, not from itself). ``make_room`` and ``keep_under_ceiling`` are the three steps
every tier's allocation takes: T's own chunks while T would pass its ceiling, then the shared queue, then T's
parked chunks.

Cost: a touch, add or removal costs one dictionary look-up more per chunk (which queue holds it), and a settle a
few moves per chunk charged or freed; a tier without budgeted tenants is never wrapped (its owner uses
``shared`` directly), so it pays nothing but the ``use`` counter. Trade-off: a spilled chunk's place in the
shared order is where it spilled (the newest end), not where its last touch would have put it; a tenant's
chunks beyond its guarantee therefore live a little longer than plain policy order would let them.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from typing import Callable, Iterable, Iterator, TypeVar

from ..protocol.retention import Retention
from ..tenants.table import TenantTable
from .entry import Entry
from .eviction import EvictionQueue
from .policies import make_queue
from .room import make_room

T = TypeVar("T")


class TierGuard:
    """Tenants' bytes in one tier, and that tier's eviction queue with each tenant's guarantee parked."""

    def __init__(self, tier: str, policy: str, table: TenantTable, charge_of: Callable[[Entry], int]) -> None:
        """Args:
            tier: ``dram``, ``disk`` or ``gpu`` (the budget of ``[tenants.NAME.TIER]`` it holds).
            policy: the tier's eviction policy (``store/policies.py``), for the shared and the parked queues.
            table: the tenants table.
            charge_of: the bytes a chunk holds in this tier now (the tier's own field of ``Entry``).
        """
        self.tier = tier
        self.policy = policy
        self.charge_of = charge_of
        self.use: dict[str, int] = defaultdict(int)
        self.evicted_by_others: dict[str, int] = defaultdict(int)   # chunks another tenant's room took
        self.refusals: dict[str, int] = defaultdict(int)            # room refused at the tenant's ceiling
        self.wrap: Callable[[EvictionQueue], EvictionQueue] | None = None   # see wrap_queues
        self.shared: EvictionQueue = make_queue(policy)
        self._set_table(table)

    def _set_table(self, table: TenantTable) -> None:
        self.table = table
        budgets = {t.name: t.budget(self.tier) for t in table.all() if t.budget(self.tier).limited}
        self.guaranteed = {name: b.guaranteed_bytes for name, b in budgets.items()}
        self.ceilings = {name: b.ceiling_bytes for name, b in budgets.items() if b.ceiling_bytes is not None}
        self.parked: dict[str, EvictionQueue] = {name: self._new_queue() for name in budgets}
        self.spilled: dict[str, OrderedDict[bytes, tuple[Entry, int]]] = {name: OrderedDict() for name in budgets}
        self.spilled_bytes: dict[str, int] = defaultdict(int)

    @property
    def budgeted(self) -> bool:
        """Whether some tenant has a budget in this tier (else its owner uses ``shared`` directly)."""
        return bool(self.parked)

    # -- accounting -------------------------------------------------------------------------------------------
    def charge(self, entry: Entry, nbytes: int) -> None:
        """``entry`` (of tenant ``entry.tenant``) holds ``nbytes`` more (negative: fewer) in this tier; called once
        the tier's field (``charge_of``) says so already."""
        name = entry.tenant
        self.use[name] += nbytes
        spilled = self.spilled.get(name)
        if spilled is None:
            return
        held = spilled.get(entry.key)
        if held is not None and held[0] is entry:
            spilled[entry.key] = (entry, held[1] + nbytes)
            self.spilled_bytes[name] += nbytes
        self._settle(name)

    def over_ceiling(self, tenant: str, extra: int) -> bool:
        """Whether ``extra`` more bytes would take ``tenant`` past its ceiling in this tier."""
        ceiling = self.ceilings.get(tenant)
        return ceiling is not None and self.use[tenant] + extra > ceiling

    def rebuild(self, table: TenantTable, entries: Iterable[Entry]) -> None:
        """Apply a reloaded table: ``use`` counted again from ``entries`` (every indexed chunk, its ``tenant``
        set already) and every queued chunk queued again, oldest first (a policy's own history is lost)."""
        queued = list(self)
        self._set_table(table)
        self.shared = self._new_queue()
        self.use.clear()
        for entry in entries:
            nbytes = self.charge_of(entry)
            if nbytes:
                self.use[entry.tenant] += nbytes
        for entry in queued:
            self.add_newest(entry)

    # -- the three steps of an allocation -----------------------------------------------------------------------
    def keep_under_ceiling(self, tenant: str, size: int, may_leave: Callable[[Entry], bool],
                           leave: Callable[[Entry], object]) -> bool:
        """Evict ``tenant``'s own chunks (oldest first) until ``size`` more bytes fit under its ceiling; False
        (counted) when its chunks that may leave cannot make the room."""
        if not self.over_ceiling(tenant, size):
            return True
        if make_room(lambda: None if self.over_ceiling(tenant, size) else True, self.own(tenant), may_leave,
                     leave) is not None:
            return True
        self.refusals[tenant] += 1
        return False

    def make_room(self, tenant: str | None, attempt: Callable[[], T | None], may_leave: Callable[[Entry], bool],
                  leave: Callable[[Entry], object]) -> T | None:
        """``attempt()`` until it succeeds, evicting from the shared queue (counted against the victims'
        tenants when not ``tenant``'s own) and then ``tenant``'s parked chunks; None when nothing may go."""
        def leave_for(victim: Entry) -> None:
            if victim.tenant != tenant and self.charge_of(victim):
                self.evicted_by_others[victim.tenant] += 1
            leave(victim)

        got = make_room(attempt, self, may_leave, leave_for)
        if got is None and tenant is not None and tenant in self.parked:
            got = make_room(attempt, self.own(tenant), may_leave, leave)
        return got

    def own(self, tenant: str) -> "OwnChunks":
        return OwnChunks(self, tenant)

    # -- the EvictionQueue interface ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.shared) + sum(len(q) for q in self.parked.values())

    def __contains__(self, entry: Entry) -> bool:
        return entry in self._queue_of(entry)

    def __iter__(self) -> Iterator[Entry]:
        """The shared queue's chunks, then each tenant's parked ones (each in its queue's order)."""
        chunks = list(self.shared)
        for queue in self.parked.values():
            chunks.extend(queue)
        return iter(chunks)

    def add_chain(self, chain: Iterable[Entry]) -> None:
        self._by_queue(chain, lambda queue, run: queue.add_chain(run), settle=True)

    def touch_chain(self, chain: Iterable[Entry]) -> None:
        self._by_queue(chain, lambda queue, run: queue.touch_chain(run), settle=False)

    def add_newest(self, entry: Entry) -> None:
        self.add_chain((entry,))

    def remove(self, entry: Entry) -> None:
        name = entry.tenant
        if name not in self.parked:
            self.shared.remove(entry)
            return
        if not self._unspill(entry):
            self.parked[name].remove(entry)
        self._settle(name)

    def push_oldest(self, entries: list[Entry]) -> None:
        """Chunks set aside by an allocation go back at the old end, in order: a budgeted tenant's to the shared
        queue while its excess over its guarantee has room for them, else to its parked queue."""
        shared: list[Entry] = []
        parked: dict[str, list[Entry]] = {}
        for entry in reversed(entries):   # newest first: each goes in front of those already placed
            name = entry.tenant
            spilled = self.spilled.get(name)
            if spilled is None:
                shared.append(entry)
                continue
            nbytes = self.charge_of(entry)
            if self.spilled_bytes[name] + nbytes <= max(0, self.use[name] - self.guaranteed[name]):
                spilled[entry.key] = (entry, nbytes)
                spilled.move_to_end(entry.key, last=False)
                self.spilled_bytes[name] += nbytes
                shared.append(entry)
            else:
                parked.setdefault(name, []).append(entry)
        self.shared.push_oldest(shared[::-1])
        for name, run in parked.items():
            self.parked[name].push_oldest(run[::-1])
            self._settle(name)

    def peek_oldest(self) -> Entry | None:
        return self.shared.peek_oldest()

    def pop_oldest(self) -> Entry | None:
        entry = self.shared.pop_oldest()
        if entry is not None and entry.tenant in self.parked:
            self._unspill(entry, queued=False)
            self._settle(entry.tenant)
        return entry

    def wrap_queues(self, wrap: Callable[[EvictionQueue], EvictionQueue]) -> None:
        """Wrap every queue of the tier, now and after a reload, in ``wrap(queue)`` (retention classes:
        ``retention.py``). Chunks stay where they are: the wrapper takes each queue as it stands."""
        self.wrap = wrap
        self.shared = wrap(self.shared)
        self.parked = {name: wrap(queue) for name, queue in self.parked.items()}

    # -- internals --------------------------------------------------------------------------------------------
    def _new_queue(self) -> EvictionQueue:
        queue = make_queue(self.policy)
        return queue if self.wrap is None else self.wrap(queue)

    def _queue_of(self, entry: Entry) -> EvictionQueue:
        """The queue that holds ``entry`` or, when none does, the one it would join."""
        spilled = self.spilled.get(entry.tenant)
        if spilled is None:
            return self.shared
        held = spilled.get(entry.key)
        return self.shared if held is not None and held[0] is entry else self.parked[entry.tenant]

    def _by_queue(self, chain: Iterable[Entry], act: Callable[[EvictionQueue, list[Entry]], None],
                  settle: bool) -> None:
        """``act`` on each queue with its part of ``chain``, in chain order."""
        chain = list(chain)
        runs: dict[int, tuple[EvictionQueue, list[Entry]]] = {}
        for entry in chain:
            queue = self._queue_of(entry)
            runs.setdefault(id(queue), (queue, []))[1].append(entry)
        for queue, run in runs.values():
            act(queue, run)
            if queue is self.shared:
                self._touch_spilled(run)
        if settle:
            for name in {e.tenant for e in chain}:
                self._settle(name)

    def _touch_spilled(self, run: list[Entry]) -> None:
        """Spilled chunks a chain touched are their tenant's newest spilled ones (deepest first, as queues do)."""
        for entry in reversed(run):
            spilled = self.spilled.get(entry.tenant)
            if spilled is not None and entry.key in spilled:
                spilled.move_to_end(entry.key)

    def _unspill(self, entry: Entry, queued: bool = True) -> bool:
        """Forget ``entry`` as spilled (and take it out of the shared queue, when ``queued``); False when it
        was not spilled."""
        spilled = self.spilled[entry.tenant]
        held = spilled.get(entry.key)
        if held is None or held[0] is not entry:
            return False
        del spilled[entry.key]
        self.spilled_bytes[entry.tenant] -= held[1]
        if queued:
            self.shared.remove(entry)
        return True

    def _settle(self, name: str) -> None:
        """Restore ``spilled bytes ≤ max(0, use − guaranteed)`` for tenant ``name`` with as much spilled as fits."""
        guaranteed = self.guaranteed.get(name)
        if guaranteed is None:
            return
        slack = max(0, self.use[name] - guaranteed)
        spilled, parked = self.spilled[name], self.parked[name]
        while spilled and self.spilled_bytes[name] > slack:   # give back: the newest spilled chunk first
            _, (entry, nbytes) = spilled.popitem()
            self.spilled_bytes[name] -= nbytes
            self.shared.remove(entry)
            parked.push_oldest([entry])
        while True:   # spill: the tenant's own next victims
            victim = parked.peek_oldest()
            if victim is None:
                break
            nbytes = self.charge_of(victim)
            if self.spilled_bytes[name] + nbytes > slack:
                break
            parked.pop_oldest()
            spilled[victim.key] = (victim, nbytes)
            self.spilled_bytes[name] += nbytes
            self.shared.add_newest(victim)


def least_kept(spilled: "OrderedDict[bytes, tuple[Entry, int]]", classes: bool, pins: bool = True) -> Entry:
    """The oldest spilled chunk (``spilled`` not empty) of the lowest retention class, a pin counting above
    ``high`` where the tier keeps pins (``pins``: DRAM), else as ``high`` (``classes``: the tier orders by class;
    else simply the oldest): a tenant held to its ceiling gives up what it asked to keep least first. The walk
    ends at the first ``low`` chunk."""
    oldest = next(iter(spilled.values()))[0]
    if not classes:
        return oldest
    best, best_rank = oldest, Retention.PIN + 1
    for entry, _ in spilled.values():
        rank = Retention(entry.retention)
        if entry.pin_until or rank is Retention.PIN:
            rank = Retention.PIN if pins else Retention.HIGH
        if rank < best_rank:
            best, best_rank = entry, rank
            if rank == Retention.LOW:
                break
    return best


class OwnChunks:
    """One tenant's evictable chunks of a guarded tier, as ``room.make_room`` takes victims: its spilled chunks
    (oldest spilled first), then its parked ones in its queue's order."""

    def __init__(self, guard: TierGuard, tenant: str) -> None:
        self.guard = guard
        self.tenant = tenant

    def pop_oldest(self) -> Entry | None:
        guard, name = self.guard, self.tenant
        spilled = guard.spilled.get(name)
        if spilled is None:
            return None   # no budget here: its chunks are all in the shared queue
        entry: Entry | None
        if spilled:
            entry = least_kept(spilled, guard.wrap is not None, guard.tier == "dram")
            guard._unspill(entry)
        else:
            entry = guard.parked[name].pop_oldest()
        if entry is not None:
            guard._settle(name)
        return entry

    def push_oldest(self, entries: list[Entry]) -> None:
        self.guard.push_oldest(entries)
