"""Property test of retention classes over the Store with tenants: for any sequence of puts (tenant, class, pin TTL)
and clock steps, under every eviction policy —

- no tenant's guaranteed bytes are evicted by another tenant's put, and no tenant passes its DRAM ceiling;
- a pin is never evicted before its TTL, and pins expire (then they are ``high``);
- pinned bytes stay within each tenant's bound (its guarantee and ``max_pin_bytes``) and match the chunks pinned;
- a lower class is never evicted while a higher one of the same tenant and pool is (within one put, nothing of
  a lower class is left behind by an eviction of a higher one): a pool is the shared queue, or a tenant's parked
  guarantee (``tier_guard.py``), whose chunks spill into the shared queue in class order but, once spilled, stay.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.errors import StoreFullError
from kvstore.protocol.retention import Retention, parse_retention
from kvstore.store.store import PinSettings, Store
from kvstore.tenants import parse_tenants
from kvstore.tiers.host.tier import HostTier
from kvstore.store.ledgers.builder import tier_ledgers
from kvstore.tiers.virtual import VirtualArena

CHUNK = 4096
TABLE = {"a": {"namespaces": ["a:"], "max_pin_bytes": 3 * CHUNK,
               "dram": {"guaranteed": 8 * CHUNK, "ceiling": 12 * CHUNK}},
         "b": {"namespaces": ["b:"], "dram": {"guaranteed": 4 * CHUNK, "ceiling": 20 * CHUNK}}}
CLASSES = ["pin", "high", "normal", "low"]

PUTS = st.tuples(st.sampled_from(["a:", "b:", "c:"]), st.integers(1, 5), st.sampled_from(CLASSES),
                 st.one_of(st.none(), st.floats(0.5, 30.0)), st.floats(0.0, 8.0))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def effective(entry) -> int:
    return Retention.PIN if entry.pin_until else entry.retention


def pool_of(store, entry) -> str:
    """Which of the DRAM guard's queues holds ``entry``: the shared one, or its tenant's parked one."""
    guard = store.budgets.held("dram")
    return "shared" if guard is None or guard._queue_of(entry) is guard.shared else "parked"


@pytest.mark.parametrize("policy", ["chain-lru", "lru", "s3-fifo"])
@settings(max_examples=300, deadline=None)
@given(puts=st.lists(PUTS, min_size=1, max_size=30))
def test_retention_holds_within_budgets(policy, puts):
    clock = Clock()
    store = Store(HostTier(VirtualArena(24 * CHUNK)), 1e9, 1e9, tier_ledgers(policy), clock=clock,
                  tenants=parse_tenants(TABLE, "t.toml"), pins=PinSettings(10.0, 20.0, 0.1))
    budgets, pins = store.budgets, store.retention.soft_pins
    for serial, (namespace, count, name, ttl, step) in enumerate(puts):
        clock.now += step
        store.expire()
        assert all(e.pin_until > clock.now for e in store.index.values() if e.pin_until), "a pin outlived its TTL"
        before = dict(budgets.use)
        queued = {e.key: ((e.tenant, pool_of(store, e)), effective(e)) for e in store.index.values()
                  if e in store.lru}
        pinned = {e.key for e in store.index.values() if e.pin_until}
        mine = budgets.tenant_of(namespace).name
        keys = [f"{namespace}{serial}.{i}".encode().ljust(16, b".") for i in range(count)]
        try:
            handle, _ = store.reserve(b"w", namespace, keys, [CHUNK] * count, None,
                                      retention=parse_retention(name, ttl if name == "pin" else None))
            store.commit(b"w", handle.id)
        except StoreFullError:
            pass
        gone = {k: v for k, v in queued.items() if k not in store.index}
        assert not pinned & gone.keys(), "a pinned chunk was evicted before its TTL"
        for tenant in budgets.table.all():
            used = budgets.use[tenant.name]
            ceiling = tenant.budget("dram").ceiling_bytes
            assert ceiling is None or used <= ceiling
            if tenant.name != mine:
                assert used >= min(before.get(tenant.name, 0), tenant.budget("dram").guaranteed_bytes)
            assert pins.by_tenant[tenant.name] <= tenant.pin_limit("dram")
            for pool in ("shared", "parked"):
                evicted = [cls for t, cls in gone.values() if t == (tenant.name, pool)]
                left = [cls for k, (t, cls) in queued.items() if t == (tenant.name, pool) and k in store.index]
                if evicted and left:
                    assert max(evicted) <= min(left), f"{tenant.name} {pool}: evicted {evicted}, {left} stayed"
        assert pins.bytes == sum(e.size for e in store.index.values() if e.pin_until)
        assert pins.chunks == sum(1 for e in store.index.values() if e.pin_until)
    clock.now += 21.0   # past the longest TTL: every pin has ended
    store.expire()
    assert pins.bytes == 0 and not any(e.retention is Retention.PIN for e in store.index.values())
