"""Eviction under pressure (host tier alone, disk tier off): LRU, continuations before prefixes, never a leased
chunk, a clear 'full' error."""

from __future__ import annotations

import pytest

import kvstore

CHUNK = 1 << 20


def test_eviction_keeps_leased_chunks(start_daemon):
    d = start_daemon("--host-mem", "8MiB", "--disk-size", "0")
    with d.client(namespace="t", chunk_tokens=4) as c:
        pinned_keys = c.chunk_keys(list(range(4 * 3)))
        payloads = [bytes([i]) * CHUNK for i in range(3)]
        c.put(pinned_keys, payloads)
        with c.get(pinned_keys) as views:
            for round_ in range(6):  # many times the tier's capacity
                keys = c.chunk_keys([1000 + round_] + list(range(4 * 4)))
                c.put(keys, [b"\xee" * CHUNK] * 4)
            assert [bytes(v) for v in views] == payloads
            assert c.lookup(pinned_keys) == 3
        assert c.stats()["counters"]["evictions"] > 0


def test_full_error_when_everything_is_leased(start_daemon):
    d = start_daemon("--host-mem", "4MiB", "--disk-size", "0")
    with d.client(namespace="t", chunk_tokens=4) as c:
        keys = c.chunk_keys(list(range(16)))
        c.put(keys, [b"a" * CHUNK] * 4)
        with c.get(keys):
            other = c.chunk_keys([9] * 4)
            with pytest.raises(kvstore.StoreFullError, match="full"):
                c.put(other, [b"b" * CHUNK])
            assert c.lookup(keys) == 4
        c.put(other, [b"b" * CHUNK])  # with the lease gone there is room again
        assert c.stats()["reservations"] == 0


def test_continuations_go_before_prefixes(start_daemon):
    d = start_daemon("--host-mem", "8MiB", "--disk-size", "0")
    with d.client(namespace="t", chunk_tokens=4) as c:
        old = c.chunk_keys(list(range(4 * 4)))
        c.put(old, [b"o" * CHUNK] * 4)
        new = c.chunk_keys([7] + list(range(4 * 5 - 1)))
        c.put(new, [b"n" * CHUNK] * 5)  # needs 1 MiB more than is free: evicts one chunk
        # The evicted chunk is the deepest of the old chain, so its first three chunks still form a prefix.
        assert c.lookup(old) == 3
        c.lookup(old)  # touch the old chain: now the new one is least recently used
        c.put(c.chunk_keys([8] * 4), [b"x" * CHUNK])
        assert c.lookup(new) == 4 and c.lookup(old) == 3


def test_chunk_larger_than_limit_is_refused(start_daemon):
    d = start_daemon("--host-mem", "4MiB", "--disk-size", "0", "--max-chunk", "1MiB")
    with d.client(namespace="t") as c:
        keys = c.chunk_keys(list(range(256)))
        with pytest.raises(kvstore.LimitError, match="largest chunk"):
            c.put(keys, [b"a" * (CHUNK + 1)])
        c.ping()
