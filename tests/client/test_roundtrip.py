"""Bytes go in and come back exactly, through a real daemon, over ipc:// (shared arena) and tcp:// (frames)."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch

import kvstore
from conftest import wait_for

SIZES = [1, 100, 4095, 4096, 4097, 256 << 10, (2 << 20) + 3, 5 << 20]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def both_daemon(start_daemon):
    port = free_port()
    d = start_daemon("--tcp", f"127.0.0.1:{port}", "--host-mem", "128MiB")
    d.tcp_address = f"tcp://127.0.0.1:{port}"
    return d


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_round_trip_many_sizes(both_daemon, transport):
    address = both_daemon.address if transport == "ipc" else both_daemon.tcp_address
    with kvstore.connect(address, namespace=f"rt-{transport}", chunk_tokens=16) as c:
        keys = c.chunk_keys(np.arange(16 * len(SIZES)))
        payloads = [os.urandom(n) for n in SIZES]
        assert c.put(keys, payloads) == len(SIZES)
        assert c.lookup(keys) == len(SIZES)
        with c.get(keys) as views:
            assert [bytes(v) for v in views] == payloads
        assert c.put(keys, payloads) == 0  # already stored: nothing rewritten


def test_tensors_round_trip(client):
    keys = client.chunk_keys(list(range(3 * 256)))
    tensors = [torch.randn(4, 8, 33, dtype=torch.bfloat16) for _ in keys]
    tensors[1] = tensors[1].transpose(0, 2)  # non-contiguous input is accepted
    client.put(keys, tensors)
    with client.get(keys) as views:
        for v, t in zip(views, tensors):
            back = torch.frombuffer(bytearray(v), dtype=torch.bfloat16).reshape(t.contiguous().shape)
            assert torch.equal(back, t.contiguous())


def test_lookup_stops_at_first_missing(client):
    keys = client.chunk_keys(list(range(10 * 256)))
    client.put(keys[:6], [b"a" * 1000] * 6)
    assert client.lookup(keys) == 6
    assert client.delete([keys[2]]) == 1
    assert client.lookup(keys) == 2
    with client.get(keys) as views:
        assert len(views) == 2
    assert client.lookup(keys[3:]) == 3  # later chunks are still there, just not reachable from the start


def test_keys_differ_across_namespaces(daemon):
    tokens = list(range(512))
    with daemon.client(namespace="model-a") as a, daemon.client(namespace="model-b") as b:
        ka, kb = a.chunk_keys(tokens), b.chunk_keys(tokens)
        assert not set(ka) & set(kb)
        a.put(ka, [b"A" * 64, b"B" * 64])
        assert a.lookup(ka) == 2
        assert b.lookup(kb) == 0


def test_empty_calls_and_misses(client):
    assert client.lookup([]) == 0
    keys = client.chunk_keys(list(range(512)))
    with client.get(keys) as views:
        assert views == []
    assert client.put([], []) == 0
    assert client.delete(keys) == 0
    with pytest.raises(ValueError):
        client.put(keys, [b"x"])


def test_views_are_invalid_after_release(client):
    keys = client.chunk_keys(list(range(256)))
    client.put(keys, [b"z" * 4096])
    lease = client.get(keys)
    view = lease.views[0]
    lease.release()
    with pytest.raises(ValueError):
        bytes(view)
    assert client.stats()["leases"] == 0


def test_clear_deletes_the_callers_namespace_only(daemon):
    with daemon.client(namespace="a") as a, daemon.client(namespace="b") as b:
        a_keys, b_keys = a.chunk_keys(list(range(512))), b.chunk_keys(list(range(768)))
        a.put(a_keys, [b"a" * 100] * 2)
        b.put(b_keys, [b"b" * 100] * 3)
        assert a.clear() == 2
        assert a.lookup(a_keys) == 0 and b.lookup(b_keys) == 3
        with b.get(b_keys) as views:
            assert [bytes(v) for v in views] == [b"b" * 100] * 3
        assert b.clear() == 3 and b.stats()["chunks"] == 0


def test_clear(client):
    keys = client.chunk_keys(list(range(1024)))
    client.put(keys, [b"q" * 100] * 4)
    assert client.clear() == 4
    assert client.lookup(keys) == 0
    # A slot whose disk write is in flight is freed when that write ends (moments later).
    wait_for(lambda: client.stats()["tiers"]["host"]["used_bytes"] == 0, 10)
    stats = client.stats()
    assert stats["tiers"]["host"]["used_bytes"] == 0
    assert stats["tiers"]["disk"]["used_bytes"] == 0


def test_many_requests_in_flight_matched_by_id(client):
    """Requests are pipelined on one connection and each caller gets its own reply."""
    from kvstore.protocol.wire import Op

    keys = client.chunk_keys(list(range(256 * 4)))
    client.put(keys, [b"a" * 1000] * 4)
    transport = client.transport
    ids = [transport.send({"op": Op.LOOKUP, "keys": keys[:n]}) for n in range(1, 5)]
    ping = transport.send({"op": Op.PING})
    transport.wait(ping)
    counts = [transport.wait(rid)[0]["count"] for rid in reversed(ids)]
    assert counts == [4, 3, 2, 1]
