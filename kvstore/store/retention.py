"""Retention classes in every tier's eviction order: one queue per class, and the bounded soft pins.

Order. ``RetentionQueue`` holds one queue of the tier's policy (``policies.py``) for each of ``low``, ``normal``
and ``high`` and takes a victim from the lowest class that has one, so a class is never evicted while a lower one
could make the room, and inside a class the policy's order holds. Each operation routes the entry by its
``Entry.retention`` to one queue: no scan, one more dict lookup than the plain queue. Every tier's guard
(``tier_guard.py``: DRAM's, the disk's, the GPU tier's) keeps plain queues until the first chunk with a class other
than ``normal`` (a put asked for one, or a restart found one: ``RetentionClasses.split_queues`` in ``classes.py``);
then each of its queues (the shared one, each tenant's parked one) becomes the ``normal`` class of a
``RetentionQueue`` as it stands, so a daemon whose puts ask nothing pays nothing, and the guard's parking of
guarantees works on the split queues unchanged (a tenant's chunks spill lowest class first). Since one
``Entry.retention`` routes a chunk in every tier, a change of class moves it in all of them at once
(``RetentionClasses.reclass``). Across a restart the class is kept in the disk file's header and the kept arena's
record (``stored_class``: a pin as ``high``).

Soft pins. In DRAM a ``pin`` chunk sits in its queue's *pinned* set (on disk and in the GPU tier, whose copies a
pin does not hold, it is a ``high`` chunk), which no victim is taken from (it counts as queued:
a lease takes it out and gives it back like any other; since a guard spills only what its parked queue would
evict, a pinned chunk never spills). ``SoftPins`` keeps the deadlines in a heap; before each DRAM allocation and
at each ``Store.expire`` the pins whose deadline passed become ``high`` chunks, at the new end of that class:
O(log n) per pin, once. A pin is bounded when it is made (at publish): its tenant's pinned bytes stay within
``Tenant.pin_limit`` (its DRAM guarantee and ``max_pin_bytes``), or, without a tenants table, the daemon's within
``--max-pin-share`` of DRAM; a pin over the bound is stored as ``high`` and counted. A put that finds only pinned
chunks left to evict gets a StoreFullError naming them (``host_full.py``): the TTL, at most ``--max-pin-ttl``,
bounds how long.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from ..protocol.retention import Retention
from .entry import Entry
from .eviction import EvictionQueue

if TYPE_CHECKING:
    from .tenant_budgets import TenantBudgets

EVICTABLE = (Retention.LOW, Retention.NORMAL, Retention.HIGH)   # victims are taken in this order


@dataclass
class RetentionCounters:
    pins: int = 0            # chunks pinned
    pins_over_bound: int = 0  # pins asked past the bound, stored as high instead
    pins_expired: int = 0     # pins whose TTL ended (they became high)
    no_store_puts: int = 0    # puts acknowledged without storing anything
    no_store_chunks: int = 0


class SoftPins:
    """Pinned chunks' bytes (per tenant and in all) and deadlines: the only code that sets ``Entry.pin_until``."""

    def __init__(self, budgets: "TenantBudgets", capacity: int, clock: Callable[[], float], default_ttl: float,
                 max_ttl: float, max_share: float) -> None:
        self.budgets = budgets
        self.capacity = capacity
        self.clock = clock
        self.default_ttl = default_ttl
        self.max_ttl = max_ttl
        self.max_share = max_share
        self.bytes = 0
        self.chunks = 0
        self.by_tenant: dict[str, int] = defaultdict(int)
        self.counters = RetentionCounters()
        self._deadlines: list[tuple[float, int, Entry]] = []
        self._seq = itertools.count()

    def limit(self, tenant: str) -> int:
        """Most bytes ``tenant``'s pins (or, without a tenants table, all pins) may hold."""
        if self.budgets.active:
            owner = self.budgets.table.get(tenant)
            return owner.pin_limit("dram") if owner is not None else 0
        return int(self.max_share * self.capacity)

    def pin(self, entry: Entry, ttl: float | None) -> bool:
        """Pin ``entry`` (already charged to its tenant) for ``ttl`` seconds (None: the default; cut to the max),
        or push an existing pin's deadline back; False, and ``entry`` made ``high``, when over the bound."""
        ttl = min(self.default_ttl if ttl is None else ttl, self.max_ttl)
        until = self.clock() + ttl
        if entry.pin_until:
            if until > entry.pin_until:
                entry.pin_until = until
                heapq.heappush(self._deadlines, (until, next(self._seq), entry))
            return True
        used = self.by_tenant[entry.tenant] if self.budgets.active else self.bytes
        if used + entry.size > self.limit(entry.tenant):
            self.counters.pins_over_bound += 1
            entry.retention = Retention.HIGH
            return False
        entry.retention = Retention.PIN
        entry.pin_until = until
        self.bytes += entry.size
        self.chunks += 1
        self.by_tenant[entry.tenant] += entry.size
        self.counters.pins += 1
        heapq.heappush(self._deadlines, (until, next(self._seq), entry))
        return True

    def unpin(self, entry: Entry) -> None:
        """``entry`` is no longer pinned (its TTL ended, or its DRAM copy went): it is a ``high`` chunk now."""
        if not entry.pin_until:
            return
        entry.pin_until = 0.0
        entry.retention = Retention.HIGH
        self.bytes -= entry.size
        self.chunks -= 1
        self.by_tenant[entry.tenant] -= entry.size

    def recount(self, entries: Iterable[Entry]) -> None:
        """Count each tenant's pinned bytes again (a reloaded tenants table may move chunks to other tenants); pins
        past a lowered bound are kept until their TTL ends, new ones are held to it."""
        self.by_tenant.clear()
        for entry in entries:
            if entry.pin_until:
                self.by_tenant[entry.tenant] += entry.size

    def due(self) -> list[Entry]:
        """Every chunk whose pin's deadline passed, still pinned (the caller unpins each, moving it to its new
        queue: ``RetentionClasses.expire_pins``); stale heap items are dropped."""
        now = self.clock()
        heap = self._deadlines
        due = []
        while heap and heap[0][0] <= now:
            until, _, entry = heapq.heappop(heap)
            if entry.pin_until == until:
                due.append(entry)
        return due

    def soonest(self) -> float | None:
        """Seconds until the next pin ends (None: none held)."""
        while self._deadlines and self._deadlines[0][2].pin_until != self._deadlines[0][0]:
            heapq.heappop(self._deadlines)
        return max(0.0, self._deadlines[0][0] - self.clock()) if self._deadlines else None

    def stats(self) -> dict[str, object]:
        """Pinned bytes and chunks now, the counters, and each tenant's pinned bytes (tenants from the table)."""
        tenants = {name: used for name, used in self.by_tenant.items() if used}
        return {"pinned_bytes": self.bytes, "pinned_chunks": self.chunks, "tenants_pinned_bytes": tenants,
                "pin_limit_bytes": None if self.budgets.active else self.limit(""), **self.counters.__dict__}


class RetentionQueue:
    """An ``EvictionQueue`` of one policy queue per class and a pinned set (see the module docstring)."""

    def __init__(self, make: Callable[[], EvictionQueue], normal: EvictionQueue, pins: bool = True) -> None:
        """Args:
            make: a new empty queue of the tier's policy (for ``low`` and ``high``).
            normal: the queue the tier used so far, as it stands: it becomes the ``normal`` class.
            pins: whether pinned chunks are kept out of the victims (DRAM, where a pin holds its copy); else
                (the disk and GPU tiers, whose copies a pin does not hold) a pinned chunk is a ``high`` one.
        """
        self._queues = {Retention.LOW: make(), Retention.NORMAL: normal, Retention.HIGH: make()}
        self._pinned: dict[bytes, Entry] = {}
        self.pins = pins

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values()) + len(self._pinned)

    def __contains__(self, entry: Entry) -> bool:
        cls = self._class_of(entry)
        if cls is Retention.PIN:
            return self._pinned.get(entry.key) is entry
        return entry in self._queues[cls]

    def __iter__(self) -> Iterator[Entry]:
        """Every queued chunk: the evictable ones lowest class first (each class oldest first), then the pinned."""
        return itertools.chain.from_iterable([list(self._queues[c]) for c in EVICTABLE] + [list(self._pinned.values())])

    def add_chain(self, chain: Iterable[Entry]) -> None:
        for cls, part in self._split(chain):
            self._queue(cls).add_chain(part) if cls is not Retention.PIN else self._pin_all(part)

    def touch_chain(self, chain: Iterable[Entry]) -> None:
        for cls, part in self._split(chain):
            if cls is not Retention.PIN:
                self._queues[cls].touch_chain(part)

    def remove(self, entry: Entry) -> None:
        cls = self._class_of(entry)
        if cls is Retention.PIN:
            if self._pinned.get(entry.key) is entry:
                del self._pinned[entry.key]
            return
        self._queues[cls].remove(entry)

    def add_newest(self, entry: Entry) -> None:
        self.add_chain([entry])

    def push_oldest(self, entries: list[Entry]) -> None:
        for cls, part in self._split(entries):
            self._queue(cls).push_oldest(part) if cls is not Retention.PIN else self._pin_all(part)

    def peek_oldest(self) -> Entry | None:
        return self._lowest(lambda queue: queue.peek_oldest())

    def pop_oldest(self) -> Entry | None:
        return self._lowest(lambda queue: queue.pop_oldest())

    def _lowest(self, take: Callable[[EvictionQueue], Entry | None]) -> Entry | None:
        """``take`` of the lowest evictable class's queue that has a chunk."""
        for cls in EVICTABLE:
            victim = take(self._queues[cls])
            if victim is not None:
                return victim
        return None

    # -- internals ---------------------------------------------------------------------------------------------
    def _queue(self, cls: Retention) -> EvictionQueue:
        return self._queues[cls]

    def _pin_all(self, entries: list[Entry]) -> None:
        for entry in entries:
            self._pinned[entry.key] = entry

    def _class_of(self, entry: Entry) -> Retention:
        """The class whose queue holds ``entry`` here: its own, a pin counting as ``high`` where pins are not kept."""
        cls = entry.retention
        return Retention.HIGH if cls is Retention.PIN and not self.pins else cls

    def _split(self, chain: Iterable[Entry]) -> list[tuple[Retention, list[Entry]]]:
        """The chain's entries by class, each part in the chain's order (one part when all share a class)."""
        parts: dict[Retention, list[Entry]] = {}
        for entry in chain:
            parts.setdefault(self._class_of(entry), []).append(entry)
        return list(parts.items())


def stored_class(entry: Entry) -> Retention:
    """The class a chunk keeps where its DRAM copy's pin does not reach (a disk file, a kept arena's record): a pin
    is ``high`` there, since its TTL does not survive a restart (and, past it, the chunk is ``high`` anyway)."""
    return Retention.HIGH if entry.retention is Retention.PIN else entry.retention
