"""Retention classes through a real daemon: low goes before normal, a pin outlives pressure until its TTL,
no-store stores nothing, and a bad class is refused in one line."""

from __future__ import annotations

import os

import pytest

import kvstore
from kvstore.protocol.wire import Op
from conftest import wait_for
from support.raw_client import RawClient

CHUNK = 1_000_000


def _keys(n: int) -> list[bytes]:
    return [os.urandom(16) for _ in range(n)]


def _held(client: kvstore.Client, keys: list[bytes]) -> list[bool]:
    return [client.lookup([k]) == 1 for k in keys]


def _flood(client: kvstore.Client, chunks: int, retention: str = "normal") -> None:
    for _ in range(chunks):
        client.put(_keys(1), [b"f" * CHUNK], retention=retention)


@pytest.mark.parametrize("credits", [True, False], ids=["credit-put", "reserve-commit"])
def test_low_chunks_are_evicted_before_normal_ones(start_daemon, credits):
    daemon = start_daemon("--host-mem", "16MiB", "--disk-size", "0")
    small = 200_000   # one chunk fits a put credit (at most 1/32 of the tier)
    with daemon.client(credits=credits) as client:
        normal, low = _keys(8), _keys(8)
        for key in normal:
            client.put([key], [b"n" * small])
        for key in low:
            client.put([key], [b"l" * small], retention="low")
        for _ in range(72):   # with the 16 above, a few chunks more than the tier holds
            client.put(_keys(1), [b"f" * small])
        held_low, held_normal = _held(client, low), _held(client, normal)
        assert not all(held_low), "the flood evicted nothing"
        assert all(held_normal) or not any(held_low), (held_low, held_normal)
        assert (client.stats()["credits"]["puts"] > 0) is credits   # the path named is the path taken


def test_a_pin_survives_pressure_until_its_ttl(start_daemon):
    daemon = start_daemon("--host-mem", "16MiB", "--disk-size", "0", "--max-pin-share", "0.25")
    with daemon.client() as client:
        pinned = _keys(2)
        client.put(pinned, [b"p" * CHUNK] * 2, retention="pin", pin_ttl=3.0)
        retention = client.stats()["retention"]
        assert retention["pinned_chunks"] == 2 and retention["pinned_bytes"] == 2 * CHUNK
        _flood(client, 40)
        assert all(_held(client, pinned))
        _flood(client, 20, "high")   # high chunks go before pinned ones too
        assert all(_held(client, pinned))
        assert wait_for(lambda: client.stats()["retention"]["pins_expired"] == 2, 30)   # the sweep ended the pins
        _flood(client, 40, "high")   # the pins ended: they are the oldest high chunks now
        assert not any(_held(client, pinned))
        retention = client.stats()["retention"]
        assert retention["pinned_chunks"] == 0 and retention["pins_expired"] == 2


def test_no_store_is_acknowledged_and_stores_nothing(start_daemon):
    daemon = start_daemon("--host-mem", "16MiB", "--disk-size", "0")
    with daemon.client() as client:
        keys = _keys(3)
        assert client.put(keys, [b"x" * CHUNK] * 3, retention="no-store") == 0
        reservation = client.reserve(keys, [CHUNK] * 3, retention="no-store")
        assert reservation.views == [None, None, None] and reservation.commit() == 0
        assert client.lookup(keys) == 0
        stats = client.stats()
        assert stats["chunks"] == 0 and stats["retention"]["no_store_chunks"] == 6


def test_a_bad_class_is_refused_in_one_line(start_daemon):
    daemon = start_daemon("--host-mem", "16MiB", "--disk-size", "0")
    raw = RawClient(daemon.address)
    try:
        assert raw.hello(arena=False)["ok"]
        reply = raw.request({"op": Op.PUT_INLINE, "id": 2, "keys": [os.urandom(16)], "retention": "keep"}, b"x")
        assert not reply["ok"] and reply["error"] == "BadRequestError"
        assert reply["msg"] == ("field 'retention' = 'keep' is not a retention class; use one of pin, high, normal, "
                                "low, no-store")
    finally:
        raw.close()
    with daemon.client() as client, pytest.raises(kvstore.UsageError, match="put: retention 'keep' is not a"):
        client.put(_keys(1), [b"x"], retention="keep")
