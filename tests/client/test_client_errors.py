"""Every error a client raises is a KVStoreError: after close(), on bad arguments, and on a refused handshake."""

from __future__ import annotations

import pytest

import kvstore


def every_call(c: kvstore.Client, keys: list[bytes]) -> dict:
    return {
        "ping": c.ping, "lookup": lambda: c.lookup(keys), "lookup_tiers": lambda: c.lookup_tiers(keys),
        "put": lambda: c.put(keys, [b"x"]), "get": lambda: c.get(keys), "delete": lambda: c.delete(keys),
        "clear": c.clear, "stats": c.stats,
    }


@pytest.mark.parametrize("use_arena", [True, False])
def test_calls_after_close_raise_client_closed(daemon, use_arena):
    c = daemon.client(namespace="closed", use_arena=use_arena)
    keys = c.chunk_keys(list(range(256)))
    c.put(keys, [b"x" * 100])
    lease = c.get(keys)
    c.close()
    c.close()   # idempotent
    lease.release()   # nothing to unpin from a closed client: no error
    for _name, call in every_call(c, keys).items():
        with pytest.raises(kvstore.ClientClosedError, match="closed; connect again"):
            call()
    with daemon.client(namespace="closed") as other:   # the daemon is fine
        assert other.lookup(keys) == 1


def test_a_lease_extended_after_close_raises_client_closed(daemon):
    c = daemon.client(namespace="closed")
    keys = c.chunk_keys(list(range(256)))
    c.put(keys, [b"x" * 100])
    lease = c.get(keys)
    c.close()
    with pytest.raises(kvstore.ClientClosedError):
        lease.extend()


@pytest.mark.parametrize("address", ["foo://bar", "/tmp/x.sock", "tcp://no-port", "ipc://"])
def test_bad_addresses_are_usage_errors(address):
    with pytest.raises(kvstore.UsageError) as info:
        kvstore.connect(address, timeout=0.5)
    assert isinstance(info.value, ValueError) and isinstance(info.value, kvstore.KVStoreError)
    if address.startswith("/"):
        assert "ipc:///tmp/x.sock" in str(info.value)


def test_bad_arguments_are_usage_errors(client):
    keys = client.chunk_keys(list(range(512)))
    with pytest.raises(kvstore.UsageError, match="2 keys but 1 buffers"):
        client.put(keys, [b"x"])
    with pytest.raises(kvstore.UsageError, match="chunk_tokens"):
        kvstore.connect(client.address, chunk_tokens=0)
