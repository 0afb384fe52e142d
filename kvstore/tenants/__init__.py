"""Tenants: who shares the daemon, the namespaces each owns and its budget per tier (``table.py``)."""

from .table import (
                    DEFAULT_TENANT,
                    NO_BUDGET,
                    TIERS,
                    Budget,
                    Tenant,
                    TenantTable,
                    check_capacities,
                    load_tenants,
                    parse_tenants,
)

__all__ = ["DEFAULT_TENANT", "NO_BUDGET", "TIERS", "Budget", "Tenant", "TenantTable", "check_capacities",
           "load_tenants", "parse_tenants"]
