"""Remote backends against real servers on loopback: Redis and Mooncake Store.

Each test starts its own server (``harness/servers.py``); a missing binary skips
the test, or fails it when CI is set. The outage tests stop or freeze the
server in the middle and check that calls turn into counted misses within
their deadline, that calls during the outage do not wait at all, and that the
backend comes back by itself when the server does.
"""

from __future__ import annotations

import logging
import os

import pytest

from conftest import wait_for

from kvstore.tiers.remote import Health, RemoteError, open_backend, record

from harness.servers import MooncakeCluster, RedisCluster, RedisServer, free_port, require

TIMEOUT = 0.5          # backend deadline for metadata calls in these tests


def start_server(kind: str, workdir, **kw):
    if kind == "redis":
        return RedisServer(workdir, binary=require("redis-server"), **kw).start()
    return MooncakeCluster(workdir, master=require("mooncake_master"),
                           node=require("mooncake_client"), **kw).start()


@pytest.fixture(params=["redis", "mooncake"])
def kind(request):
    return request.param


@pytest.fixture
def server(kind, tmp_path):
    srv = start_server(kind, tmp_path / kind)
    yield srv
    srv.stop()


@pytest.fixture
def backend(server):
    b = open_backend(server.url, namespace="test/ns", timeout=TIMEOUT, retry_interval=0.2)
    yield b
    b.close()


def chunks(n: int, size: int, seed: int = 0):
    keys = [bytes([seed, i]) * 8 for i in range(n)]
    payloads = [os.urandom(size) for _ in range(n)]
    return keys, payloads


def raw_put(backend, name: str, value: bytes) -> None:
    """Write ``value`` under ``name`` bypassing the record format."""
    if backend.scheme == "redis":
        backend._client.set(name, value)
    else:
        backend._ensure()
        assert backend._store.put(name, value) == 0


def put(backend, keys, payloads) -> int:
    """Store and wait: how many of ``keys`` were stored (0 when the put was dropped)."""
    fut = backend.submit_put(keys, payloads)
    return 0 if fut is None else fut.result(30)


def stored(backend, keys, namespace=None) -> int:
    """How many leading ``keys`` the store holds."""
    return len(backend.batch_lookup(keys, namespace))


def get(backend, keys, namespace=None, room: int = 1 << 20):
    """Each key's payload as bytes, None where missing or bad (buffers of ``room`` bytes)."""
    bufs = [bytearray(room) for _ in keys]
    got = backend.batch_get_into(keys, bufs, namespace)
    return [None if n is None else bytes(buf[:n]) for n, buf in zip(got, bufs)]


def wait_until(predicate, timeout: float = 30.0) -> bool:
    return wait_for(predicate, timeout, interval=0.1)


# --------------------------------------------------------------- round trips

def test_round_trip(backend):
    keys, payloads = chunks(4, 256 * 1024)
    payloads[2] = os.urandom(3000)                   # sizes may differ
    assert put(backend, keys, payloads) == 4
    assert stored(backend, keys) == 4
    assert [bytes(v) for v in get(backend, keys)] == payloads
    bufs = [bytearray(len(p)) for p in payloads]
    assert backend.batch_get_into(keys, bufs) == [len(p) for p in payloads]
    assert [bytes(b) for b in bufs] == payloads
    stats = backend.stats()
    assert stats["up"] == 1 and stats["errors"] == 0 and stats["puts"] == 4
    assert stats["hits"] == 8 and stats["get_bytes"] == 2 * sum(map(len, payloads))


def test_lookup_gives_payload_sizes_for_exact_slots(backend):
    keys, payloads = chunks(4, 1000)
    payloads[1] = os.urandom(70_000)
    assert put(backend, keys[:2] + keys[3:], payloads[:2] + payloads[3:]) == 3
    sizes = backend.batch_lookup(keys)
    assert sizes == [1000, 70_000]                      # leading run only
    slots = [bytearray(n) for n in sizes]
    assert backend.batch_get_into(keys[:2], slots) == sizes
    assert [bytes(s) for s in slots] == payloads[:2]
    assert backend.batch_lookup([]) == []


def test_get_into_a_larger_buffer(backend):
    keys, payloads = chunks(2, 10_000)
    put(backend, keys, payloads)
    bufs = [bytearray(20_000) for _ in keys]
    assert backend.batch_get_into(keys, bufs) == [10_000, 10_000]
    assert [bytes(b[:10_000]) for b in bufs] == payloads
    small = [bytearray(100) for _ in keys]
    assert backend.batch_get_into(keys, small) == [None, None]


def test_zero_copy_region(backend):
    arena = bytearray(4 << 20)
    backend.register_memory(arena)
    view = memoryview(arena)
    keys, payloads = chunks(2, 1 << 20)
    view[:1 << 20] = payloads[0]
    view[1 << 20:2 << 20] = payloads[1]
    assert put(backend, keys, [view[:1 << 20], view[1 << 20:2 << 20]]) == 2
    out = [view[2 << 20:3 << 20], view[3 << 20:]]
    assert backend.batch_get_into(keys, out) == [1 << 20, 1 << 20]
    assert bytes(out[0]) == payloads[0] and bytes(out[1]) == payloads[1]


def test_leading_count_stops_at_first_miss(backend):
    keys, payloads = chunks(5, 1000)
    assert put(backend, keys[:2] + keys[3:], payloads[:2] + payloads[3:]) == 4
    assert stored(backend, keys) == 2
    got = get(backend, keys)
    assert [g is not None for g in got] == [True, True, False, True, True]
    assert stored(backend, []) == 0 and get(backend, []) == []


def test_namespaces_are_separate(backend, server):
    keys, payloads = chunks(1, 1000)
    put(backend, keys, payloads)
    assert stored(backend, keys, namespace="other") == 0
    assert get(backend, keys, namespace="other") == [None]


def test_background_put(backend):
    keys, payloads = chunks(3, 64 * 1024)
    fut = backend.submit_put(keys, payloads)
    assert fut is not None and fut.result(10) == 3
    assert stored(backend, keys) == 3
    assert backend.stats()["pending_put_bytes"] == 0


def test_background_put_queue_is_bounded(server):
    with open_backend(server.url, timeout=TIMEOUT, max_pending_bytes=1000) as b:
        keys, payloads = chunks(1, 2000)
        assert b.submit_put(keys, payloads) is None
        assert b.stats()["put_dropped"] == 1


# ------------------------------------------------------------ bad or missing values

def test_vanished_value_is_a_miss(backend):
    keys, payloads = chunks(3, 1000)
    put(backend, keys, payloads)
    assert backend.delete(keys[1:2]) == 1
    assert stored(backend, keys) == 1
    assert [g is not None for g in get(backend, keys)] == [True, False, True]
    assert backend.stats()["errors"] == 0


@pytest.mark.parametrize("damage", ["garbage", "flipped", "truncated", "other-key"])
def test_corrupt_value_is_a_miss(backend, damage):
    keys, payloads = chunks(2, 5000, seed=7)
    good = record.encode(backend.namespace, keys[0], payloads[0])
    bad = {
        "garbage": os.urandom(len(good)),
        "flipped": good[:-1] + bytes([good[-1] ^ 0x40]),
        "truncated": good[:-100],
        "other-key": record.encode(backend.namespace, keys[1], payloads[0]),
    }[damage]
    raw_put(backend, backend.object_name(keys[0]), bad)
    assert get(backend, keys[:1]) == [None]
    assert backend.batch_get_into(keys[:1], [bytearray(5000)]) == [None]
    stats = backend.stats()
    assert stats["corrupt"] == 2 and stats["hits"] == 0 and stats["errors"] == 0


# ------------------------------------------------------------------- outages

def test_stopped_server_degrades_to_misses_and_recovers(kind, server, backend, caplog):
    keys, payloads = chunks(3, 64 * 1024)
    assert put(backend, keys, payloads) == 3
    caplog.set_level(logging.WARNING, logger="kvstore")

    server.stop()
    assert stored(backend, keys) == 0
    assert backend.health is Health.DOWN
    assert backend.batch_lookup(keys) == []

    calls = backend.stats()["calls"]                  # while down: no waiting at all, no call is even made
    for _ in range(50):
        assert stored(backend, keys) == 0
        assert get(backend, keys) == [None] * 3
    assert backend.stats()["calls"] == calls
    assert backend.submit_put(keys, payloads) is None
    stats = backend.stats()
    assert stats["outages"] == 1 and stats["errors"] >= 1 and stats["skipped"] >= 100
    assert stats["up"] == 0
    outage_logs = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(outage_logs) == 1                      # logged once per outage

    server.start()
    # The restarted store is empty: comes back by itself, then serves new puts.
    assert wait_until(lambda: put(backend, keys, payloads) == 3), backend.stats()
    assert backend.healthy
    assert stored(backend, keys) == 3
    assert [bytes(v) for v in get(backend, keys)] == payloads
    assert backend.stats()["outages"] == 1
    assert any("event=remote_back " in r.getMessage() for r in caplog.records)


def test_frozen_server_costs_one_deadline(kind, server, backend):
    keys, payloads = chunks(2, 1000)
    assert put(backend, keys, payloads) == 2
    frozen = server.master if kind == "mooncake" else server
    frozen.pause()
    try:
        assert stored(backend, keys) == 0   # our deadline or the client's own RPC timeout, whichever fires first
        skipped = backend.stats()["skipped"]
        assert get(backend, keys) == [None, None]
        assert backend.stats()["skipped"] > skipped   # the second call costs no deadline: it is not made
        assert backend.stats()["errors"] >= 1 and not backend.healthy
    finally:
        frozen.resume()
    assert wait_until(lambda: stored(backend, keys) == 2, timeout=15)
    assert backend.stats()["outages"] == 1


def test_backend_opened_while_server_down(kind, tmp_path):
    srv = start_server(kind, tmp_path / "late")
    url = srv.url
    srv.stop()
    with open_backend(url, timeout=TIMEOUT, retry_interval=0.2) as b:
        assert stored(b, [b"k" * 16]) == 0
        assert not b.healthy
        srv.start()
        try:
            keys, payloads = chunks(1, 100)
            assert wait_until(lambda: put(b, keys, payloads) == 1, timeout=60)
            assert stored(b, keys) == 1
        finally:
            srv.stop()


# ------------------------------------------------------------ server-specific

def test_redis_ttl_expiry_is_a_miss(tmp_path):
    with RedisServer(tmp_path, binary=require("redis-server")) as srv:
        with open_backend(srv.url + "?ttl=1", timeout=TIMEOUT) as b:
            keys, payloads = chunks(2, 1000)
            assert put(b, keys, payloads) == 2
            assert stored(b, keys) == 2
            assert wait_until(lambda: stored(b, keys) == 0, timeout=5)
            assert get(b, keys) == [None, None] and b.healthy


def test_redis_maxmemory_eviction_is_tolerated(tmp_path):
    with RedisServer(tmp_path, binary=require("redis-server"), maxmemory="4mb") as srv:
        with open_backend(srv.url, timeout=TIMEOUT) as b:
            keys, payloads = chunks(32, 256 * 1024)
            for k, p in zip(keys, payloads):
                put(b, [k], [p])
            got = get(b, keys)
            held = [g is not None for g in got]
            # Redis's LRU is sampled, so which keys go is not exact: some went, some stayed, and every one that
            # stayed reads back exactly; the vanished ones are misses, not errors.
            assert not all(held) and any(held)
            assert all(bytes(g) == p for g, p in zip(got, payloads) if g is not None)
            assert b.healthy and b.stats()["errors"] == 0


def test_mooncake_lost_storage_node_is_a_miss(tmp_path):
    with MooncakeCluster(tmp_path, master=require("mooncake_master"),
                         node=require("mooncake_client")) as cluster:
        with open_backend(cluster.url, timeout=TIMEOUT) as b:
            keys, payloads = chunks(2, 4096)
            assert put(b, keys, payloads) == 2
            cluster.node.stop()
            assert b.batch_get_into(keys, [bytearray(4096) for _ in keys]) == [None, None]
            assert get(b, keys) == [None, None]


def test_unknown_scheme():
    with pytest.raises(ValueError):
        open_backend("memcached://127.0.0.1:11211")


def test_remote_errors_are_kvstore_errors():
    import kvstore.errors as errors

    assert issubclass(RemoteError, errors.KVStoreError) and RemoteError is errors.RemoteError
    assert issubclass(record.RecordError, errors.FormatError) and issubclass(record.RecordError, ValueError)


def test_async_calls_share_the_pool_and_leave_the_loop_free(backend):
    """The awaited calls run on the backend's pool: while one runs, the loop takes other turns (a call that
    blocked the loop would let no other task run until it returned)."""
    import asyncio

    keys, payloads = chunks(2, 2048)
    assert put(backend, keys, payloads) == 2
    turns = 0

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal turns
        while not stop.is_set():
            await asyncio.sleep(0)   # one turn of the loop: a yield, not a wait
            turns += 1

    async def main():
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        await asyncio.sleep(0)   # the ticker is running
        before = turns
        sizes = await backend.lookup_async(keys)
        during_lookup = turns - before
        bufs = [bytearray(n) for n in sizes]
        before = turns
        got = await backend.get_into_async(keys, bufs)
        during_get = turns - before
        stop.set()
        await tick
        return sizes, got, bufs, during_lookup, during_get

    sizes, got, bufs, during_lookup, during_get = asyncio.run(main())
    assert sizes == got == [2048, 2048] and [bytes(b) for b in bufs] == payloads
    assert during_lookup > 0 and during_get > 0   # the loop turned while each call ran


def test_public_surface():
    import kvstore.tiers.remote as remote

    from kvstore.errors import RemoteError as TreeError

    assert set(remote.__all__) == {"Health", "RemoteBackend", "RemoteError", "open_backend"}
    defined_here = {name for name, value in vars(remote).items()
                    if not name.startswith("_") and getattr(value, "__module__", "").startswith("kvstore.tiers.remote")}
    assert defined_here | {"RemoteError"} == set(remote.__all__), "every public name of the package is exported"
    assert remote.RemoteError is TreeError   # re-exported from the one error tree, not a second class


def test_redis_cluster_down_at_start_is_an_outage():
    with open_backend(f"redis://127.0.0.1:{free_port()}?cluster=1", timeout=TIMEOUT) as b:
        assert stored(b, [b"k" * 16]) == 0
        assert not b.healthy


def test_redis_cluster_round_trip(tmp_path):
    with RedisCluster(tmp_path, binary=require("redis-server"), cli=require("redis-cli")) as cluster:
        with open_backend(cluster.url, timeout=TIMEOUT) as b:
            keys, payloads = chunks(12, 4096)          # spread over the three masters' slots
            assert put(b, keys, payloads) == 12
            assert stored(b, keys) == 12
            assert [bytes(v) for v in get(b, keys)] == payloads
            assert b.delete(keys[:1]) == 1
            assert stored(b, keys) == 0 and b.stats()["errors"] == 0
