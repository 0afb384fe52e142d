"""The remote tier wired into the daemon: two daemons on one machine stand for two hosts sharing a store.

Each daemon has its own socket, host arena and disk directory; the store is a real ``redis-server`` (or
``mooncake_master`` with a storage node) on loopback, started by ``harness/servers.py``.
"""

from __future__ import annotations

import os

import pytest

from kvstore.metrics.collector import unmapped_paths
from kvstore.tiers.remote import record
from kvstore.binding import rebind
from conftest import wait_for
from harness.daemons import run_cli

from harness.servers import MooncakeCluster, RedisServer, require

WAIT = "5s"   # --remote-wait: generous, so that a busy 2-core machine never turns a hit into a miss


def wait_until(predicate, timeout: float = 30.0, step: float = 0.05) -> bool:
    """``conftest.wait_for`` with this module's longer default (a remote put lands in the background)."""
    return wait_for(predicate, timeout, interval=step)


def remote_stats(client) -> dict:
    return client.stats()["remote"]


def chain(client, seed: int, n: int = 3) -> tuple[list[bytes], list[bytes]]:
    keys = client.chunk_keys([seed * 100_000 + t for t in range(n * 256)])
    payloads = [os.urandom(40_000 + 1000 * i) for i in range(n)]   # mixed sizes: slots must be exact
    return keys, payloads


def put_and_share(a, keys, payloads) -> None:
    """Put through daemon A and wait until its background puts have reached the store."""
    before = remote_stats(a)["puts"]
    assert a.put(keys, payloads) == len(keys)
    assert wait_until(lambda: remote_stats(a)["puts"] >= before + len(keys)), remote_stats(a)


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path / "redis", binary=require("redis-server")).start()
    yield server
    server.stop()


@pytest.fixture
def two_hosts(start_daemon):
    def start(url: str, *extra: str):
        a = start_daemon("--remote", url, "--remote-wait", WAIT, *extra)
        b = start_daemon("--remote", url, "--remote-wait", WAIT, *extra)
        return a.client(namespace="m"), b.client(namespace="m")
    clients = []

    def started(url: str, *extra: str):
        pair = start(url, *extra)
        clients.extend(pair)
        return pair
    yield started
    for c in clients:
        c.close()


def test_chunk_put_on_a_is_read_exactly_on_b(redis_server, two_hosts):
    a, b = two_hosts(redis_server.url)
    keys, payloads = chain(a, 1)
    put_and_share(a, keys, payloads)

    found = b.lookup_tiers(keys)
    assert found.count == 3 and found.tiers == {"remote": 3}
    with b.get(keys) as views:
        assert [bytes(v) for v in views] == payloads
    assert b.lookup_tiers(keys).tiers == {"host": 3}     # promoted: B serves them locally from now on
    stats = b.stats()
    assert stats["counters"]["promotions_remote_host"] == 3
    assert stats["counters"]["promoted_bytes_remote_host"] == sum(map(len, payloads))
    assert stats["remote"]["hits"] == 3 and stats["remote"]["lookup_chunks"] == 3
    assert stats["hit_tokens"] == 2 * 3 * 256
    assert unmapped_paths(stats) == []                   # every remote number has a metric
    # B does not send chunks it fetched back to the store
    assert stats["remote"]["puts"] == 0
    shown = run_cli("stats", "--socket", b.address[len("ipc://"):])
    assert shown.returncode == 0 and "remote store" in shown.stdout and "3 chunks found" in shown.stdout


def test_local_prefix_then_remote_continuation(redis_server, two_hosts):
    a, b = two_hosts(redis_server.url)
    keys, payloads = chain(a, 2, n=4)
    assert b.put(keys[:1], payloads[:1]) == 1            # B holds the first chunk itself
    put_and_share(a, keys, payloads)
    found = b.lookup_tiers(keys)
    assert found.count == 4 and found.tiers == {"host": 1, "remote": 3}
    with b.get(keys) as views:
        assert [bytes(v) for v in views] == payloads


def test_corrupted_value_in_the_store_is_a_miss(redis_server, two_hosts):
    import redis

    a, b = two_hosts(redis_server.url)
    keys, payloads = chain(a, 3, n=2)
    put_and_share(a, keys, payloads)
    raw = redis.Redis.from_url(redis_server.url)
    name = record.object_name("kvstore", rebind("m", keys[1]))   # named by the key bound to its namespace
    raw.setrange(name, record.HEADER_SIZE + 100, b"\xff\x00\xff")   # damage the second chunk's payload
    raw.close()

    b.lookup(keys)                    # counts what the store lists; the bytes are checked on arrival
    with b.get(keys) as views:
        assert [bytes(v) for v in views] == payloads[:1]    # the good first chunk, never the damaged one
    assert b.lookup_tiers(keys).tiers == {"host": 1}         # and lookups stop offering it
    stats = remote_stats(b)
    assert stats["corrupt"] == 1 and stats["unreadable_keys"] == 1
    with b.get(keys, verify=True) as views:   # the fetched chunk carries the record's checksum
        assert [bytes(v) for v in views] == payloads[:1]
    with a.get(keys, verify=True) as views:   # A's own copies, intact in its DRAM, are untouched
        assert [bytes(v) for v in views] == payloads


def test_store_outage_keeps_local_hits_and_recovers(redis_server, two_hosts):
    a, b = two_hosts(redis_server.url)
    keys, payloads = chain(a, 4)
    put_and_share(a, keys, payloads)
    with b.get(keys) as views:        # no lookup first: a get alone does not fetch from the store
        assert views == []
    assert b.lookup(keys) == 3
    with b.get(keys) as views:
        assert [bytes(v) for v in views] == payloads

    # A store that is up but does not answer: local hits never ask it, a local miss costs one deadline at most.
    redis_server.pause()
    try:
        assert b.lookup_tiers(keys).tiers == {"host": 3}
        other, _ = chain(a, 5)
        assert b.lookup(other) == 0
        assert b.lookup(keys + other) == 3
        with b.get(keys) as views:
            assert [bytes(v) for v in views] == payloads
    finally:
        redis_server.resume()

    redis_server.stop()
    new, new_payloads = chain(a, 6)
    assert a.put(new, new_payloads) == 3                 # the put succeeds locally; its remote copy is dropped
    assert b.lookup(keys) == 3 and b.lookup(new) == 0
    assert b.lookup(keys + new) == 3
    stats = remote_stats(b)
    assert stats["up"] == 0 and stats["outages"] >= 1

    redis_server.start()             # back, and empty: the tier returns by itself and shares new chunks again
    seed = 7

    def shared_again() -> bool:
        nonlocal seed
        seed += 1
        k, p = chain(a, seed)
        a.put(k, p)
        return wait_until(lambda: b.lookup(k) == 3, timeout=1.0, step=0.2)
    assert wait_until(shared_again, timeout=30, step=0.1), (remote_stats(a), remote_stats(b))
    assert remote_stats(b)["up"] == 1 and remote_stats(a)["put_dropped"] >= 3


def test_mooncake_store_shares_chunks_between_daemons(tmp_path, two_hosts):
    with MooncakeCluster(tmp_path / "mooncake", segment_size="256MB", master=require("mooncake_master"),
                         node=require("mooncake_client")) as cluster:
        a, b = two_hosts(cluster.url)
        keys, payloads = chain(a, 9)
        put_and_share(a, keys, payloads)
        assert b.lookup_tiers(keys).tiers == {"remote": 3}
        with b.get(keys) as views:
            assert [bytes(v) for v in views] == payloads
        assert b.stats()["counters"]["promotions_remote_host"] == 3


@pytest.mark.parametrize("url, message", [
    ("ftp://127.0.0.1:21", "accepted schemes: redis://, rediss://, valkey://, valkeys://, mooncake://"),
    ("redis://", "names no host"),
])
def test_bad_remote_url_is_one_clear_line(tmp_path, url, message):
    result = run_cli("serve", "--socket", str(tmp_path / "s.sock"), "--remote", url)
    assert result.returncode == 2 and message in result.stderr


def test_a_store_down_at_start_is_said_at_start_in_key_value_lines(start_daemon):
    import socket as sockets

    with sockets.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = start_daemon("--remote", f"redis://127.0.0.1:{port}", "--remote-wait", "100ms")
    lines = d.log().splitlines()
    down = [line for line in lines if "event=remote_unavailable " in line]
    assert len(down) == 1 and f"url=redis://127.0.0.1:{port}" in down[0] and "level=WARNING" in down[0], lines
    started = [line for line in lines if "event=remote_tier " in line]
    assert len(started) == 1 and "up=False" in started[0], lines
    assert lines.index(down[0]) < next(i for i, line in enumerate(lines) if "event=ready " in line)
    assert all(" event=" in line for line in lines if line.startswith("ts=")), lines
    with d.client(namespace="t") as c:   # the daemon serves from its local tiers meanwhile
        keys = c.chunk_keys(list(range(256)))
        c.put(keys, [b"x" * 100])
        assert c.lookup(keys) == 1


def test_the_remote_store_keeps_namespaces_apart_and_invalidate_deletes_what_it_wrote(redis_server, start_daemon):
    """Keys bound to their namespace in the remote store: a chunk another namespace put under this namespace's
    keys on host A is not fetched by this namespace on host B, while the same namespace still shares across hosts;
    ``kvstore invalidate`` on A deletes the values A wrote, so B fetches none of them."""
    hosts = [start_daemon("--remote", redis_server.url, "--remote-wait", WAIT) for _ in range(2)]
    with hosts[0].client(namespace="nsB") as evil, hosts[0].client(namespace="nsA") as a, \
            hosts[1].client(namespace="nsA") as b:
        keys, payloads = chain(a, 7)
        put_and_share(evil, keys, [b"EVIL" * 10_000] * len(keys))
        assert b.lookup_tiers(keys).count == 0
        put_and_share(a, keys, payloads)
        assert b.lookup_tiers(keys).count == len(keys)   # fetched: this namespace still shares across hosts
        with b.get(keys) as views:
            assert [bytes(v) for v in views] == payloads
        other, other_payloads = chain(a, 8)
        put_and_share(a, other, other_payloads)
        with hosts[0].client(namespace="operator") as op:
            report = op.invalidate(["nsA"])
        assert report["chunks"] == {"nsA": 6} and report["remote_deleted"] == 6
        assert b.lookup_tiers(other).count == 0   # B never held them, and the store has them no more
