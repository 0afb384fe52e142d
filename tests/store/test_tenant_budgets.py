"""Tenants' DRAM budgets in the Store: guarantees survive other tenants' puts, ceilings hold, refusals name them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.errors import StoreFullError
from kvstore.store import credits
from kvstore.store.store import Store
from kvstore.tenants import parse_tenants
from kvstore.tiers.host.tier import HostTier
from kvstore.store.ledgers.builder import tier_ledgers
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


@pytest.fixture(autouse=True)
def roomy_credits(monkeypatch):
    """Credits of up to 6 chunks from this small arena (the daemon's shares would lend it less than one)."""
    monkeypatch.setattr(credits, "ONE_CREDIT_SHARE", 4)
    monkeypatch.setattr(credits, "ALL_CREDITS_SHARE", 2)


def credit_put(store: Store, namespace: str, first: int, count: int, owner: bytes = b"c") -> int:
    """A put into a put credit (``credits.py``), as the daemon's CREDIT_PUT does it: a credit taken first when
    the writer holds none, then the chunks laid out in it; 0 when no credit could be lent."""
    held = store.credits.table.ids_of(owner)
    credit_id = next(iter(held)) if held else 0
    if not credit_id:
        _, grant = store.credits.put(owner, namespace, 0, [], [], [], None, count * CHUNK)
        credit_id = grant.id
    if not credit_id:
        return 0
    credit = store.credits.table.peek(owner, credit_id).payload
    if credit.size < count * CHUNK:   # the writer asks for a bigger one, as the client does
        _, grant = store.credits.put(owner, namespace, credit_id, [], [], [], None, count * CHUNK)
        if not grant.id:
            return 0
        credit_id, credit = grant.id, store.credits.table.peek(owner, grant.id).payload
    keys = [f"{namespace}{first + i}".encode().ljust(16, b".") for i in range(count)]
    offsets = [credit.offset + i * CHUNK for i in range(count)]
    committed, _ = store.credits.put(owner, namespace, credit_id, keys, offsets, [CHUNK] * count, None,
                                     count * CHUNK)
    return committed


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a:", "b:", "c:"]), st.integers(1, 6), st.booleans()), min_size=1,
                max_size=40))
def test_no_guarantee_is_evicted_for_another_tenant_and_no_ceiling_is_passed(puts):
    """Puts by reserve + commit and into put credits alike."""
    store = make_store()
    budgets = store.budgets
    serial = 0
    for namespace, count, credited in puts:
        before = dict(budgets.use)
        mine = store.budgets.tenant_of(namespace).name
        try:
            (credit_put if credited else put)(store, namespace, serial, count)
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
        lent = sum(h.payload.size for h in store.credits.table)
        assert store.credits.lent_bytes == lent


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


def test_a_credit_put_is_held_to_its_tenants_ceiling():
    store = make_store()
    assert credit_put(store, "a:", 0, 4) == 4   # a credit lent: charged to nobody until the put
    assert credit_put(store, "a:", 4, 4) == 4
    assert credit_put(store, "a:", 8, 4) == 4
    assert credit_put(store, "a:", 12, 2) == 2   # past a's ceiling of 12 chunks: two of its oldest chain went
    assert store.budgets.use["a"] == 12 * CHUNK and store.budgets.refusals["a"] == 0
    gone = {f"a:{i}".encode().ljust(16, b".") for i in range(14)} - set(store.index)
    assert len(gone) == 2 and gone < {f"a:{i}".encode().ljust(16, b".") for i in range(4)}


def test_a_credit_put_its_own_leased_chunks_block_is_refused_and_the_credit_freed():
    store = make_store()
    put(store, "a:", 0, 12)
    for key in list(store.index):
        store.get(b"reader", [key])
    used = store.host.used_bytes
    with pytest.raises(StoreFullError, match=r"tenant a is at its dram ceiling \(guaranteed 32.0 KiB, ceiling "
                                             r"48.0 KiB"):
        credit_put(store, "a:", 100, 2)
    assert store.budgets.refusals["a"] == 1 and store.budgets.use["a"] == 12 * CHUNK
    assert len(store.credits) == 0 and store.credits.lent_bytes == 0   # the credit's room went back
    assert len(store.index) == 12   # nothing stored was lost
    assert store.host.used_bytes == used
