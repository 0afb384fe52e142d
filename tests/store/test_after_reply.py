"""A put's reply goes out once its chunks are readable; the eviction queue, the checksum job and the counters
follow it (``store/after_reply.py``). In the Store: what is readable at once and what waits. Through real
daemons, on every put path and transport: nothing a client can observe comes before that work is done."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import wait_for

import kvstore
from kvstore.store.after_reply import AfterReply
from kvstore.store.store import Store
from kvstore.tiers.host.tier import HostTier
from kvstore.store.ledgers.builder import tier_ledgers
from kvstore.tiers.virtual import VirtualArena

PAGE = 4096


def _deferring_store() -> Store:
    return Store(HostTier(VirtualArena(64 * PAGE)), 30.0, 30.0, tier_ledgers(), clock=lambda: 0.0,
                 after_reply=AfterReply())


def test_a_commit_is_readable_at_once_and_queued_and_counted_after_the_reply():
    store = _deferring_store()
    keys = [os.urandom(16) for _ in range(4)]
    handle, _ = store.reserve(b"w", "ns", keys, [PAGE] * 4, None)
    assert store.commit(b"w", handle.id) == 4
    assert [e.key for e in store.leading(keys)] == keys      # readable: the reply may say so
    assert store.counters.put_chunks == 0 and len(store.after_reply) == 1
    store.puts.settle_after_reply()
    assert store.counters.put_chunks == 4 and len(store.after_reply) == 0
    # queued for eviction now: filling the tier evicts from them, the oldest chain
    more = [os.urandom(16) for _ in range(62)]
    handle, _ = store.reserve(b"w", "ns", more, [PAGE] * 62, None)
    store.commit(b"w", handle.id)
    store.puts.settle_after_reply()
    handle, _ = store.reserve(b"w", "ns", [os.urandom(16)], [PAGE], None)
    assert len(store.leading(keys)) < 4 and len(store.leading(more)) == 62


def test_chunks_whose_queueing_is_still_owed_are_never_evicted_for_the_same_request():
    store = _deferring_store()
    keys = [os.urandom(16) for _ in range(64)]
    handle, _ = store.reserve(b"w", "ns", keys, [PAGE] * 64, None)
    store.commit(b"w", handle.id)
    with pytest.raises(kvstore.StoreFullError):   # nothing evictable yet: they are not in the queue
        store.reserve(b"w", "ns", [os.urandom(16)], [PAGE], None)
    store.puts.settle_after_reply()
    store.reserve(b"w", "ns", [os.urandom(16)], [PAGE], None)


def test_a_failing_piece_of_owed_work_is_logged_and_the_rest_still_runs(caplog):
    owed = AfterReply()
    ran = []
    owed.add(lambda: ran.append(1))
    owed.add(lambda: 1 / 0)
    owed.add(lambda: ran.append(3))
    owed.run()
    assert ran == [1, 3] and len(owed) == 0
    assert "after_reply_failed" in caplog.text


SETTINGS = [{}, {"credits": False}, {"stream": False, "shared_index": False}]
SETTINGS_IDS = ["credit-put", "reserve-commit", "zmq"]


def _rounds(c, rounds: int) -> tuple[list[bytes], list[bytes]]:
    """Puts back to back, each followed at once by requests that see it: counted, verified. Returns the keys of
    the first and the last round."""
    payloads = [np.random.randint(0, 255, 64 << 10, dtype=np.uint8) for _ in range(8)]
    for round_ in range(rounds):
        keys = c.chunk_keys([round_ + 1] * 4 * 8)
        assert c.put(keys, payloads) == 8
        assert c.stats()["counters"]["put_chunks"] == 8 * (round_ + 1)
        with c.get(keys, verify=True) as views:   # the checksum job was queued before this was handled
            assert [bytes(v) for v in views] == [p.tobytes() for p in payloads]
    return c.chunk_keys([1] * 4 * 8), keys


@pytest.mark.parametrize("settings", SETTINGS, ids=SETTINGS_IDS)
def test_what_follows_a_put_sees_it_counted_verified_and_queued_for_eviction(start_daemon, settings):
    daemon = start_daemon("--host-mem", "8MiB", "--disk-size", "0")
    with kvstore.connect(daemon.address, namespace="after-reply", chunk_tokens=4, **settings) as c:
        first, last = _rounds(c, 40)   # 40 rounds of 512 KiB through 8 MiB: each evicts the oldest
        assert c.lookup(first) == 0 and c.lookup(last) == 8


@pytest.mark.parametrize("settings", SETTINGS[:2], ids=SETTINGS_IDS[:2])
def test_chunks_put_with_a_disk_tier_are_all_written_back(start_daemon, settings):
    daemon = start_daemon("--host-mem", "8MiB")
    with kvstore.connect(daemon.address, namespace="after-reply", chunk_tokens=4, **settings) as c:
        first, _last = _rounds(c, 40)
        assert wait_for(lambda: c.stats()["disk"]["write_queue_chunks"] == 0)
        result = c.lookup_tiers(first, promote=False)
        assert result.count == 8 and result.tiers == {"disk": 8}   # summed, then written back before eviction
        assert c.stats()["integrity"]["sums"] == 8 * 40
