"""Each tenant's DRAM bytes against its budget, and which chunks a put may evict (``tenants/table.py``).

The Store charges a chunk's bytes to its tenant (``Entry.tenant``, from its namespace) when the chunk takes a DRAM
slot and gives them back when the slot is freed, so the use of every tenant is known at once. An allocation for
tenant T then evicts, in order:

1. T's own chunks, oldest first, while T would pass its ceiling (or the put is refused with StoreFullError naming
   T and its budget when T's own chunks cannot make the room);
2. the shared pool in the tier's policy order: every chunk but those whose loss would take their tenant below
   its guarantee (those keep their place in the queue);
3. only then T's own guaranteed chunks, in policy order: a tenant's guarantee is kept from others, not from
   itself, but its own puts take the shared room first.

Cost: step 1 walks the queue for T's chunks, and step 2 sets protected chunks aside one by one, so an
allocation pays for the protected chunks older than its victim; with no tenants table neither runs.
"""

from __future__ import annotations

from collections import defaultdict

from ..tenants.table import DEFAULT_TENANT, Tenant, TenantTable
from ..units import format_size
from .entry import Entry

TIER = "dram"


class TenantBudgets:
    """The DRAM use of every tenant (the only code that changes ``Entry.dram_charge``)."""

    def __init__(self, table: TenantTable | None = None) -> None:
        self.table = table or TenantTable()
        self.use: dict[str, int] = defaultdict(int)
        self.evicted_by_others: dict[str, int] = defaultdict(int)   # chunks of a tenant another's put evicted
        self.refusals: dict[str, int] = defaultdict(int)            # puts refused at the tenant's ceiling

    @property
    def active(self) -> bool:
        return self.table.configured

    def tenant_of(self, namespace: str) -> Tenant:
        return self.table.tenant_for(namespace)

    def charge(self, entry: Entry) -> None:
        """``entry`` took a DRAM slot: its bytes count against its tenant."""
        if entry.dram_charge:
            return
        entry.tenant = self.tenant_of(entry.namespace).name
        entry.dram_charge = entry.size
        self.use[entry.tenant] += entry.size

    def discharge(self, entry: Entry) -> None:
        """``entry``'s DRAM slot was freed."""
        if entry.dram_charge:
            self.use[entry.tenant] -= entry.dram_charge
            entry.dram_charge = 0

    def over_ceiling(self, tenant: Tenant, extra: int) -> bool:
        ceiling = tenant.budget(TIER).ceiling_bytes
        return ceiling is not None and self.use[tenant.name] + extra > ceiling

    def protected(self, victim: Entry, for_tenant: str | None) -> bool:
        """Whether evicting ``victim`` would take its tenant below its guarantee (``for_tenant``: the tenant the
        room is for, whose own chunks are not protected from it; None protects every tenant's)."""
        if victim.tenant == for_tenant or not victim.dram_charge:
            return False
        owner = self.table.get(victim.tenant)
        guaranteed = owner.budget(TIER).guaranteed_bytes if owner is not None else 0
        return self.use[victim.tenant] - victim.dram_charge < guaranteed

    def ceiling_message(self, tenant: Tenant, size: int) -> str:
        return (f"tenant {tenant.name} is at its dram ceiling ({tenant.budget(TIER).describe()}; "
                f"{format_size(self.use[tenant.name])} held, none of it evictable now) and cannot take "
                f"{format_size(size)} more; raise its ceiling or release its leases")

    def stats(self) -> dict[str, dict[str, int | None]]:
        """Per tenant: DRAM bytes held, its guarantee and ceiling, chunks others evicted, puts refused."""
        out: dict[str, dict[str, int | None]] = {}
        for tenant in self.table.all():
            budget = tenant.budget(TIER)
            out[tenant.name] = {"dram_bytes": self.use[tenant.name], "dram_guaranteed": budget.guaranteed_bytes,
                                "dram_ceiling": budget.ceiling_bytes,
                                "evicted_by_others": self.evicted_by_others[tenant.name],
                                "ceiling_refusals": self.refusals[tenant.name]}
        return out

    def replace(self, table: TenantTable, entries: list[Entry]) -> None:
        """Apply a reloaded table whole: every charged chunk is charged again to its (possibly new) tenant."""
        self.table = table
        self.use.clear()
        for entry in entries:
            if entry.dram_charge:
                entry.dram_charge = 0
                self.charge(entry)


__all__ = ["DEFAULT_TENANT", "TenantBudgets"]
