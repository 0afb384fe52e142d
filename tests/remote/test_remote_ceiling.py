"""A tenant's remote ceiling held by a real daemon against a real ``redis-server``: the bytes the daemon wrote to
the store for the tenant and has not deleted never pass the ceiling (its oldest values are deleted from the
store first), the store holds the newest values, and another tenant is untouched."""

from __future__ import annotations

import os

import pytest

from conftest import wait_for

from kvstore.tiers.remote import record
from kvstore.binding import rebind

from harness.servers import RedisServer, require

pytestmark = pytest.mark.integration

PAYLOAD = 40_000
VALUE = PAYLOAD + record.HEADER_SIZE
CEILING = 5 * VALUE + 100   # room for five values
TABLE = f"""
[tenants.chat]
namespaces = ["chat:"]
[tenants.chat.remote]
ceiling = {CEILING}
"""


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path / "redis", binary=require("redis-server")).start()
    yield server
    server.stop()


def _put_and_land(client, key: bytes) -> None:
    """One chunk put, and its remote put ended (so it may be deleted for a later one)."""
    before = client.stats()["remote"]
    assert client.put([key], [os.urandom(PAYLOAD)]) == 1
    assert wait_for(lambda: (lambda s: s["puts_in_flight"] == 0 and s["calls"] > before["calls"])(
        client.stats()["remote"]), timeout=30)


def _stored(url: str) -> dict[bytes, int]:
    import redis
    raw = redis.Redis.from_url(url)
    try:
        return {name: raw.strlen(name) for name in raw.scan_iter()}
    finally:
        raw.close()


def test_a_tenants_remote_writes_are_held_to_its_ceiling(redis_server, start_daemon, tmp_path):
    config = tmp_path / "kvstore.toml"
    config.write_text(TABLE)
    daemon = start_daemon("--config", str(config), "--remote", redis_server.url, "--remote-wait", "5s")
    with daemon.client(namespace="chat:m") as chat, daemon.client(namespace="other") as other:
        keys = [os.urandom(16) for _ in range(9)]
        for key in keys:
            _put_and_land(chat, key)
            row = chat.stats()["tenants"]["chat"]["tiers"]["remote"]
            assert row["bytes"] <= CEILING and sum(_stored(redis_server.url).values()) <= CEILING
        theirs = [os.urandom(16) for _ in range(3)]
        for key in theirs:
            _put_and_land(other, key)   # no remote ceiling: never deleted for chat's puts, nor held
        stored = _stored(redis_server.url)
        names = {record.object_name("kvstore", rebind(ns, k)).encode(): k   # named by keys bound to the namespace
                 for ns, ks in (("chat:m", keys), ("other", theirs)) for k in ks}
        held = [names[n] for n in stored]
        assert sorted(held) == sorted(keys[-5:] + theirs)   # chat's newest five, and all of the other's
        row = chat.stats()["tenants"]["chat"]["tiers"]["remote"]
        assert row == {"bytes": 5 * VALUE, "guaranteed": 0, "ceiling": CEILING, "evicted_by_others": 0,
                       "ceiling_refusals": 0, "deleted_for_ceiling": 4, "seen_missing": 0}
        assert chat.stats()["tenants"]["default"]["tiers"]["remote"]["bytes"] == 0   # not booked: no ceiling
        # a value the store lost (evicted, here deleted behind the daemon's back) leaves the book once a lookup
        # of the daemon finds it missing
        import redis
        raw = redis.Redis.from_url(redis_server.url)
        raw.delete(record.object_name("kvstore", rebind("chat:m", keys[-1])))
        raw.close()
        assert chat.delete([keys[-1]]) == 1 and chat.lookup([keys[-1]]) == 0
        row = chat.stats()["tenants"]["chat"]["tiers"]["remote"]
        assert row["seen_missing"] == 1 and row["bytes"] == 4 * VALUE
