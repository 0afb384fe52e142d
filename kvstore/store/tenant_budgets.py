"""Each tenant's bytes in every tier against its budget (``tenants/table.py``), one ``TierGuard`` per tier.

A chunk's bytes are charged to its tenant (``Entry.tenant``, from its namespace) when it takes a tier's space
and given back when it frees it: DRAM slots by the Store (``Entry.dram_charge``), disk files by the disk ledger
(``Entry.disk_bytes``), GPU slots by the GPU ledger (the chunk's size while it has or fills a GPU slot). So the
use of every tenant in every tier is known at once. An allocation for tenant T in a tier evicts, in order
(``tier_guard.py``, where the queues that make each step a pop are):

1. T's own chunks, oldest first, while T would pass its ceiling (else the room is refused: a DRAM put fails with
   StoreFullError naming T and its budget; a disk or GPU copy is simply not made, and counted);
2. the shared pool in the tier's policy order, which holds no chunk whose loss would take its tenant below its
   guarantee (those are parked out of it);
3. only then T's own guaranteed chunks: a tenant's guarantee is kept from others, not from itself.

The remote tier's ceiling is held by the remote mover on the values this daemon wrote there
(``tiers/remote/book.py``): the Store does not know what the remote store keeps (it evicts on its own), and no
remote guarantee can be held.

With no tenants table every tier's queue is the plain policy queue, and only the ``use`` counters run.
"""

from __future__ import annotations

from typing import Callable

from ..tenants.table import DEFAULT_TENANT, Tenant, TenantTable
from ..units import format_size
from .entry import Entry
from .eviction import EvictionQueue
from .policies import DEFAULT_POLICY
from .tier_guard import TierGuard

HELD_TIERS = ("dram", "disk", "gpu")
NAMES_CACHED = 4096   # namespaces whose tenant name is remembered (they come from the wire: bounded)


def gpu_charge(entry: Entry) -> int:
    """The bytes ``entry`` holds in the GPU tier: its size while it has, or is filling, a GPU slot."""
    return entry.size if entry.gpu_offset is not None or entry.gpu_loading is not None else 0


CHARGE_OF: dict[str, Callable[[Entry], int]] = {"dram": lambda e: e.dram_charge, "disk": lambda e: e.disk_bytes,
                                                "gpu": gpu_charge}


class TenantBudgets:
    """The use of every tenant in every held tier (the only code that changes ``Entry.dram_charge`` and
    ``Entry.tenant``)."""

    def __init__(self, table: TenantTable | None = None, policy: str = DEFAULT_POLICY) -> None:
        self.table = table or TenantTable()
        self.guards = {tier: TierGuard(tier, policy, self.table, CHARGE_OF[tier]) for tier in HELD_TIERS}
        self.dram = self.guards["dram"]
        self._names: dict[str, str] = {}
        self._held = self._held_guards()

    @property
    def active(self) -> bool:
        return self.table.configured

    def _held_guards(self) -> dict[str, TierGuard | None]:
        active = self.table.configured
        return {tier: guard if active and guard.budgeted else None for tier, guard in self.guards.items()}

    # DRAM's figures, as they were before the other tiers were held (tests and the simulator read them)
    @property
    def use(self) -> dict[str, int]:
        return self.dram.use

    @property
    def evicted_by_others(self) -> dict[str, int]:
        return self.dram.evicted_by_others

    @property
    def refusals(self) -> dict[str, int]:
        return self.dram.refusals

    def tenant_of(self, namespace: str) -> Tenant:
        return self.table.tenant_for(namespace)

    def name_of(self, namespace: str) -> str:
        """The name of the tenant that owns ``namespace`` (remembered: this is on every charge)."""
        name = self._names.get(namespace)
        if name is None:
            if len(self._names) >= NAMES_CACHED:
                self._names.clear()
            name = self._names[namespace] = self.table.tenant_for(namespace).name
        return name

    def queue(self, tier: str) -> EvictionQueue:
        """What ``tier``'s owner evicts from: its guard when some tenant has a budget there, else the plain queue."""
        guard = self._held[tier]
        return self.guards[tier].shared if guard is None else guard   # not ``or``: an empty guard is falsy

    def held(self, tier: str) -> TierGuard | None:
        """``tier``'s guard when some tenant has a budget there (its allocations take the three steps)."""
        return self._held[tier]

    def assign(self, entry: Entry) -> None:
        """Name ``entry``'s tenant from its namespace (before any tier charges it)."""
        entry.tenant = self.name_of(entry.namespace)

    def charge(self, entry: Entry) -> None:
        """``entry`` took a DRAM slot: its bytes count against its tenant."""
        if entry.dram_charge:
            return
        self.assign(entry)
        entry.dram_charge = entry.size
        self.dram.charge(entry, entry.size)

    def discharge(self, entry: Entry) -> None:
        """``entry``'s DRAM slot was freed."""
        if entry.dram_charge:
            charged, entry.dram_charge = entry.dram_charge, 0
            self.dram.charge(entry, -charged)

    def over_ceiling(self, tenant: Tenant, extra: int) -> bool:
        return self.dram.over_ceiling(tenant.name, extra)

    def ceiling_message(self, tenant: Tenant, size: int) -> str:
        return (f"tenant {tenant.name} is at its dram ceiling ({tenant.budget('dram').describe()}; "
                f"{format_size(self.dram.use[tenant.name])} held, none of it evictable now) and cannot take "
                f"{format_size(size)} more; raise its ceiling or release its leases")

    def stats(self) -> dict[str, dict]:
        """Per tenant: DRAM bytes held, its guarantee and ceiling, chunks others evicted, puts refused (DRAM, as
        before), and under ``tiers`` the same for each held tier (``ceiling_refusals``: DRAM puts refused, disk
        writes and GPU promotions not made at the tenant's ceiling)."""
        out: dict[str, dict] = {}
        for tenant in self.table.all():
            name = tenant.name
            budget = tenant.budget("dram")
            tiers = {tier: {"bytes": g.use[name], "guaranteed": tenant.budget(tier).guaranteed_bytes,
                            "ceiling": tenant.budget(tier).ceiling_bytes,
                            "evicted_by_others": g.evicted_by_others[name], "ceiling_refusals": g.refusals[name]}
                     for tier, g in self.guards.items()}
            out[name] = {"dram_bytes": self.dram.use[name], "dram_guaranteed": budget.guaranteed_bytes,
                         "dram_ceiling": budget.ceiling_bytes,
                         "evicted_by_others": self.dram.evicted_by_others[name],
                         "ceiling_refusals": self.dram.refusals[name], "tiers": tiers}
        return out

    def replace(self, table: TenantTable, entries: list[Entry]) -> None:
        """Apply a reloaded table whole: every chunk is charged again, in every tier, to its (possibly new)
        tenant, and every tier's queue is rebuilt for the new budgets."""
        self.table = table
        self._names.clear()
        for entry in entries:
            self.assign(entry)
        for guard in self.guards.values():
            guard.rebuild(table, entries)
        self._held = self._held_guards()


__all__ = ["DEFAULT_TENANT", "HELD_TIERS", "TenantBudgets"]
