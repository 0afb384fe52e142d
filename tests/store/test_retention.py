"""Retention classes in the Store: eviction order by class, soft pins bounded and expiring, no-store."""

from __future__ import annotations

import pytest

from kvstore.errors import StoreFullError
from kvstore.protocol.retention import Retention, parse_retention
from kvstore.store.retention import RetentionQueue
from kvstore.store.store import PinSettings, Store
from kvstore.tiers.host.tier import HostTier
from kvstore.store.ledgers.builder import tier_ledgers
from kvstore.tiers.virtual import VirtualArena

CHUNK = 4096


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_store(chunks: int = 8, policy: str = "chain-lru", share: float = 0.5, clock: Clock | None = None) -> Store:
    return Store(HostTier(VirtualArena(chunks * CHUNK)), 1e9, 1e9, tier_ledgers(policy), clock=clock or Clock(),
                 pins=PinSettings(default_ttl=10.0, max_ttl=20.0, max_share=share))


def keys_of(name: str, count: int) -> list[bytes]:
    return [f"{name}{i}".encode().ljust(16, b".") for i in range(count)]


def put(store: Store, name: str, count: int, retention: str = "normal", ttl: float | None = None) -> list[bytes]:
    keys = keys_of(name, count)
    handle, _ = store.reserve(b"w", "ns", keys, [CHUNK] * count, None, retention=parse_retention(retention, ttl))
    store.commit(b"w", handle.id)
    return keys


@pytest.mark.parametrize("policy", ["chain-lru", "lru", "s3-fifo"])
def test_low_goes_before_normal_and_normal_before_high(policy):
    store = make_store(policy=policy)
    high = put(store, "h", 2, "high")
    normal = put(store, "n", 2)
    low = put(store, "l", 2, "low")
    put(store, "x", 4)   # needs 2 chunks' room past the 8
    assert not any(k in store.index for k in low)
    assert all(k in store.index for k in high)
    put(store, "y", 2)
    assert not any(k in store.index for k in normal[:1] + low) and all(k in store.index for k in high)


def test_a_plain_daemon_keeps_its_plain_queue():
    store = make_store()
    put(store, "n", 3)
    assert not isinstance(store.lru, RetentionQueue)
    put(store, "l", 1, "low")
    assert isinstance(store.lru, RetentionQueue) and len(store.lru) == 4


def test_a_pin_survives_pressure_until_its_ttl_then_is_high():
    clock = Clock()
    store = make_store(clock=clock)
    pinned = put(store, "p", 2, "pin", ttl=5.0)
    high = put(store, "h", 2, "high")
    assert store.retention.soft_pins.bytes == 2 * CHUNK
    for round_ in range(3):
        put(store, f"f{round_}-", 6)
    assert all(k in store.index for k in pinned) and not any(k in store.index for k in high)
    clock.now = 6.0
    store.expire()
    assert store.retention.soft_pins.bytes == 0 and store.retention.soft_pins.counters.pins_expired == 2
    assert all(store.index[k].retention is Retention.HIGH for k in pinned)
    put(store, "g", 8)
    assert not any(k in store.index for k in pinned)


def test_pins_over_the_bound_are_stored_high_and_counted():
    store = make_store(share=0.25)   # 2 of 8 chunks
    keys = put(store, "p", 3, "pin")
    assert [store.index[k].retention for k in keys] == [Retention.PIN, Retention.PIN, Retention.HIGH]
    assert store.retention.soft_pins.counters.pins_over_bound == 1 and store.retention.soft_pins.chunks == 2


def test_a_ttl_past_the_max_is_cut_to_it():
    store = make_store()
    keys = put(store, "p", 1, "pin", ttl=1000.0)
    assert store.index[keys[0]].pin_until == 20.0


def test_a_put_that_only_pins_block_names_them():
    store = make_store(chunks=4, share=1.0)
    put(store, "p", 4, "pin")
    with pytest.raises(StoreFullError, match=r"held by soft pins .*retry once the pins end \(the first in 10s"):
        put(store, "x", 1)


def test_a_put_again_raises_the_class_and_extends_a_pin():
    clock = Clock()
    store = make_store(clock=clock)
    keys = put(store, "a", 2, "low")
    put(store, "a", 2, "high")
    assert all(store.index[k].retention is Retention.HIGH for k in keys)
    put(store, "a", 2, "low")   # never lowered
    assert all(store.index[k].retention is Retention.HIGH for k in keys)
    put(store, "a", 1, "pin")
    clock.now = 5.0
    put(store, "a", 1, "pin")
    assert store.index[keys[0]].pin_until == 15.0 and store.retention.soft_pins.chunks == 1


def test_a_leased_pin_returns_pinned_and_a_deleted_one_is_unpinned():
    store = make_store()
    keys = put(store, "p", 2, "pin")
    lease, _ = store.get(b"r", keys)
    assert lease is not None
    store.release(b"r", lease.id)
    assert all(store.index[k] in store.lru for k in keys)
    store.delete(keys)
    assert store.retention.soft_pins.bytes == 0 and store.retention.soft_pins.chunks == 0


@pytest.mark.parametrize("bad, why", [("keep", "not a retention class; use one of pin, high, normal, low, no-store"),
                                      (3, "not a retention class")])
def test_an_unknown_class_is_refused_in_one_line(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_retention(bad)


def test_pin_ttl_applies_to_pins_only():
    with pytest.raises(ValueError, match="pin_ttl is given with retention 'high'"):
        parse_retention("high", 5)
    with pytest.raises(ValueError, match=r"pin_ttl -1 must be"):
        parse_retention("pin", -1)


def test_a_reloaded_tenants_table_counts_pins_again():
    from kvstore.tenants import parse_tenants

    table = {"a": {"namespaces": ["ns"], "dram": {"guaranteed": 4 * CHUNK}}}
    store = Store(HostTier(VirtualArena(8 * CHUNK)), 1e9, 1e9, tier_ledgers(), clock=Clock(),
                  tenants=parse_tenants(table, "t.toml"))
    put(store, "p", 2, "pin")
    assert store.retention.soft_pins.by_tenant["a"] == 2 * CHUNK
    store.set_tenants(parse_tenants({"b": {"namespaces": ["ns"], "dram": {"guaranteed": 4 * CHUNK}}}, "t.toml"))
    assert store.retention.soft_pins.by_tenant == {"b": 2 * CHUNK}


def test_classes_split_the_tier_guards_queues_and_survive_a_reload():
    from kvstore.tenants import parse_tenants

    table = {"a": {"namespaces": ["a:"], "dram": {"guaranteed": 2 * CHUNK}}}
    store = Store(HostTier(VirtualArena(8 * CHUNK)), 1e9, 1e9, tier_ledgers(), clock=Clock(),
                  tenants=parse_tenants(table, "t.toml"))

    def put_ns(namespace: str, name: str, count: int, retention: str = "normal") -> list[bytes]:
        keys = keys_of(name, count)
        handle, _ = store.reserve(b"w", namespace, keys, [CHUNK] * count, None, retention=parse_retention(retention))
        store.commit(b"w", handle.id)
        return keys

    pinned = put_ns("a:", "p", 2, "pin")
    high = put_ns("b:", "h", 2, "high")
    low = put_ns("b:", "l", 2, "low")
    store.set_tenants(parse_tenants(table, "t.toml"))   # a reload rebuilds the guard's queues, split again
    assert all(store.index[k] in store.lru for k in pinned + high + low)
    put_ns("b:", "x", 4)
    assert all(k in store.index for k in pinned + high) and not any(k in store.index for k in low)
