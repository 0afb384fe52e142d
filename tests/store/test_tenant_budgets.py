"""Tenants' DRAM budgets in the Store: guarantees survive other tenants' puts, ceilings hold, refusals name them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.errors import StoreFullError
from kvstore.store.store import Store
from kvstore.tenants import parse_tenants
from kvstore.tiers.host.tier import HostTier
from kvstore.tiers.ledgers import tier_ledgers
from kvstore.tiers.virtual import VirtualArena

CHUNK = 4096
TABLE = {"a": {"namespaces": ["a:"], "dram": {"guaranteed": 8 * CHUNK, "ceiling": 12 * CHUNK}},
         "b": {"namespaces": ["b:"], "dram": {"guaranteed": 4 * CHUNK, "ceiling": 20 * CHUNK}}}


def make_store(table=TABLE, chunks: int = 24) -> Store:
    return Store(HostTier(VirtualArena(chunks * CHUNK)), 1e9, 1e9, tier_ledgers(), clock=lambda: 0.0,
                 tenants=parse_tenants(table, "t.toml"))


def put(store: Store, namespace: str, first: int, count: int) -> None:
    keys = [f"{namespace}{first + i}".encode().ljust(16, b".") for i in range(count)]
    handle, _ = store.reserve(b"w", namespace, keys, [CHUNK] * count, None)
    store.commit(b"w", handle.id)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a:", "b:", "c:"]), st.integers(1, 6)), min_size=1, max_size=40))
def test_no_guarantee_is_evicted_for_another_tenant_and_no_ceiling_is_passed(puts):
    store = make_store()
    budgets = store.budgets
    serial = 0
    for namespace, count in puts:
        before = dict(budgets.use)
        mine = store.budgets.tenant_of(namespace).name
        try:
            put(store, namespace, serial, count)
        except StoreFullError as exc:
            assert "tenant" in str(exc) or "host" in str(exc).lower() or "DRAM" in str(exc)
        serial += count
        for tenant in store.budgets.table.all():
            used = budgets.use[tenant.name]
            ceiling = tenant.budget("dram").ceiling_bytes
            assert ceiling is None or used <= ceiling
            if tenant.name != mine:   # another's put never takes it below its guarantee (or what it held)
                assert used >= min(before.get(tenant.name, 0), tenant.budget("dram").guaranteed_bytes)
        assert sum(budgets.use.values()) == sum(e.dram_charge for e in store.index.values())


def test_a_tenant_at_its_ceiling_evicts_its_own_chunks_first():
    store = make_store()
    put(store, "b:", 0, 10)
    put(store, "a:", 0, 12)
    put(store, "a:", 100, 4)
    assert store.budgets.use["a"] == 12 * CHUNK and store.budgets.use["b"] == 10 * CHUNK
    assert store.budgets.evicted_by_others["b"] == 0


def test_a_put_its_own_leased_chunks_block_is_refused_naming_tenant_and_budget():
    store = make_store()
    put(store, "a:", 0, 12)
    for key in list(store.index):   # each chunk leased: none of tenant a's may leave
        store.get(b"reader", [key])
    with pytest.raises(StoreFullError, match=r"tenant a is at its dram ceiling \(guaranteed 32.0 KiB, ceiling "
                                             r"48.0 KiB"):
        put(store, "a:", 100, 1)
    assert store.budgets.refusals["a"] == 1


def test_without_a_tenants_table_nothing_changes():
    store = Store(HostTier(VirtualArena(4 * CHUNK)), 1e9, 1e9, tier_ledgers(), clock=lambda: 0.0)
    put(store, "x:", 0, 4)
    put(store, "y:", 0, 4)
    assert not store.budgets.active and len(store.index) == 4


def test_a_reload_charges_chunks_to_their_new_tenants():
    store = make_store()
    put(store, "c:", 0, 3)
    assert store.budgets.use["default"] == 3 * CHUNK
    store.set_tenants(parse_tenants({"c": {"namespaces": ["c:"]}}, "t.toml"))
    assert store.budgets.use["c"] == 3 * CHUNK and store.budgets.use["default"] == 0
