"""Each tenant's remote ceiling, held on what the daemon can know: the values it wrote to the remote store.

The daemon cannot know what a remote store keeps (Redis and Mooncake evict on their own, and other hosts' daemons
write to the same store), but it knows what it wrote there itself. So for every tenant with a ``remote`` ceiling
the book keeps the values this daemon wrote for it and has not deleted or seen missing since, oldest first, and
their bytes (record header included): an upper bound of what the store keeps of that tenant from this daemon.
A put is charged when it is planned, before it is sent, and stays charged even if the store refused some of it
(an upper bound never undercounts); so the bytes the store can hold of the tenant from this daemon never pass
its ceiling.

Planning a put (``plan``): when the tenant's bytes plus the put's would pass its ceiling, the tenant's oldest
values that have landed (whose put ended: deleting one still in flight could race its put) are chosen as
victims, enough to make the room. The mover deletes them from the store first and sends the put only once the
delete succeeded (``deleted``); a delete that fails gives the victims back and drops the put (``restore``), and
a put the backend does not take (store down, queue full) is unbooked (``unsent``). A put the ceiling refuses
outright (larger than the ceiling, or with too few landed values to delete) is not sent, and counted. A value
seen missing (a lookup of this daemon asked the store for it and it was not there) leaves the book: the store
evicted it.

What it does not hold: the book counts this daemon's writes since it started (or since the tenant's ceiling was
set by a reload), not what earlier runs or other hosts wrote; and no guarantee can be held in the remote store,
which evicts on its own whatever a tenant was promised, so the remote ``guaranteed`` share is read, checked and
never acted on. Cost: a dictionary operation per value written; a tenant without a remote ceiling is not booked.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

_plan_ids = itertools.count(1)


@dataclass
class Plan:
    """One put of one tenant as the book allowed it: the values to delete from the store first, and the put's."""

    tenant: str
    keys: list[bytes]                        # the put's values, in order
    fresh: dict[bytes, int]                  # those not booked before, and their bytes (charged by the plan)
    victims: list[tuple[bytes, int]] = field(default_factory=list)   # (key, bytes) to delete first, oldest first
    id: int = field(default_factory=lambda: next(_plan_ids))

    @property
    def victim_keys(self) -> list[bytes]:
        return [key for key, _ in self.victims]


@dataclass
class Value:
    """One value the daemon wrote (or is writing) to the store for a tenant."""

    nbytes: int
    writing: int = 0     # puts of it in flight: while any is, it is never a victim (its delete could race them)
    last_plan: int = 0   # the plan that wrote it last


@dataclass
class TenantRemote:
    """One tenant's values in the book, oldest first, and the counters."""

    values: OrderedDict[bytes, Value] = field(default_factory=OrderedDict)
    bytes: int = 0
    deleting: int = 0            # bytes of victims whose delete is in flight (still counted in ``bytes``)
    deleted: int = 0             # values deleted from the store to hold the ceiling
    refusals: int = 0            # puts not sent at the ceiling
    seen_missing: int = 0        # values a lookup found gone from the store


class RemoteBook:
    """The values this daemon wrote to the remote store per tenant with a remote ceiling (see the module doc)."""

    def __init__(self, ceiling_of: Callable[[str], int | None]) -> None:
        """``ceiling_of(tenant)``: the tenant's remote ceiling in bytes, None when it has none (read on every
        plan, so a reload's new table applies at once)."""
        self.ceiling_of = ceiling_of
        self.tenants: dict[str, TenantRemote] = defaultdict(TenantRemote)
        self._owner: dict[bytes, str] = {}   # key -> the tenant whose book holds it

    def plan(self, tenant: str, keys: Sequence[bytes], sizes: Sequence[int]) -> Plan | None:
        """Book a put of ``keys`` (value sizes ``sizes``) for ``tenant``: its fresh bytes charged, and its
        oldest landed values chosen for deletion where the ceiling needs the room. None (counted) when the
        ceiling refuses the put; a Plan without victims for a tenant without a remote ceiling (nothing booked)."""
        ceiling = self.ceiling_of(tenant)
        if ceiling is None:
            return Plan(tenant, list(keys), {})
        book = self.tenants[tenant]
        fresh: dict[bytes, int] = {}
        for key, size in zip(keys, sizes):
            if key not in book.values:
                fresh[key] = size
        victims = self._victims(book, set(keys), book.bytes + sum(fresh.values()) - ceiling)
        if victims is None:
            book.refusals += 1
            return None
        plan = Plan(tenant, list(keys), fresh, victims)
        for key, size in victims:
            del book.values[key]
            book.deleting += size
        for key in keys:
            value = book.values.get(key)
            if value is None:
                value = book.values[key] = Value(fresh[key])
                book.bytes += value.nbytes
                self._owner[key] = tenant
            else:
                book.values.move_to_end(key)   # written again: its value is new in the store
            value.writing += 1
            value.last_plan = plan.id
        return plan

    def landed(self, plan: Plan) -> None:
        """The plan's put ended: its values may be chosen as victims once no other put of them is in flight."""
        book = self.tenants.get(plan.tenant)
        if book is None:
            return
        for key in plan.keys:
            value = book.values.get(key)
            if value is not None and value.writing:
                value.writing -= 1

    def deleted(self, plan: Plan) -> None:
        """The plan's victims were deleted from the store: their bytes leave the book."""
        book = self.tenants[plan.tenant]
        for key, size in plan.victims:
            book.bytes -= size
            book.deleting -= size
            book.deleted += 1
            if self._owner.get(key) == plan.tenant and key not in book.values:
                del self._owner[key]

    def unsent(self, plan: Plan) -> None:
        """The plan's put was never sent: the values it booked afresh leave the book, unless a later put wrote
        them since (then they stay booked, an upper bound)."""
        self.landed(plan)
        book = self.tenants.get(plan.tenant)
        if book is None:
            return
        for key in plan.fresh:
            value = book.values.get(key)
            if value is not None and value.last_plan == plan.id:
                del book.values[key]
                book.bytes -= value.nbytes
                self._owner.pop(key, None)

    def restore(self, plan: Plan) -> None:
        """The plan's delete failed: the victims are booked again (at the old end, since the store may still hold
        them), and the put, never sent, is not."""
        self.unsent(plan)
        book = self.tenants[plan.tenant]
        for key, size in reversed(plan.victims):
            book.deleting -= size
            if key in book.values:   # written again since it was chosen: booked already
                book.bytes -= size
                continue
            book.values[key] = Value(size)
            book.values.move_to_end(key, last=False)
            self._owner[key] = plan.tenant

    def seen_missing(self, key: bytes) -> None:
        """A lookup found ``key`` gone from the store (it evicted it): it leaves the book, unless a put of it is
        in flight."""
        tenant = self._owner.get(key)
        if tenant is None:
            return
        book = self.tenants[tenant]
        value = book.values.get(key)
        if value is None or value.writing:
            return
        del book.values[key]
        del self._owner[key]
        book.bytes -= value.nbytes
        book.seen_missing += 1

    def stats(self, tenant: str) -> dict[str, int]:
        """``tenant``'s booked bytes and counters (zeros for a tenant not booked)."""
        book = self.tenants.get(tenant) or TenantRemote()
        return {"bytes": book.bytes, "deleted_for_ceiling": book.deleted, "ceiling_refusals": book.refusals,
                "seen_missing": book.seen_missing}

    @staticmethod
    def _victims(book: TenantRemote, keep: set[bytes], over: int) -> list[tuple[bytes, int]] | None:
        """The oldest values no put is writing (not in ``keep``) whose bytes make ``over`` bytes of room; None
        when those cannot."""
        victims: list[tuple[bytes, int]] = []
        for key, value in book.values.items():
            if over <= 0:
                break
            if not value.writing and key not in keep:
                victims.append((key, value.nbytes))
                over -= value.nbytes
        return victims if over <= 0 else None
