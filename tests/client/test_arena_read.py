"""Gets without a round trip (client/arena_read.py) and queued puts (put(wait=False), client/credit.py).

get_into copies chunks straight out of the arena, located through the published index, and keeps a copy only
when the slot's sequence and the table's epoch are unchanged after it: these tests hold it to the leased get's
answers and to its guarantees (a reused slot is never read as the old chunk, even while a writer evicts the
chunks being read; a verifying reader takes the leased path); queued puts are seen by every later read of the
client and report their errors at flush."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kvstore
from kvstore.errors import BadRequestError, UsageError

SIZE = 64 << 10


def _content(key: bytes, size: int = SIZE) -> bytes:
    """A chunk's bytes made from its key: a copy of any other chunk (or a torn mix) cannot pass for it."""
    return (key * (size // len(key) + 1))[:size]


def _dests(n: int, size: int = SIZE) -> list[np.ndarray]:
    return [np.zeros(size, dtype=np.uint8) for _ in range(n)]


def test_get_into_copies_the_stored_prefix_without_a_round_trip(daemon):
    with daemon.client(namespace="t") as c:
        keys = c.chunk_keys(list(range(256 * 6)))
        c.put(keys, [_content(k) for k in keys])
        before = c.stats()["requests"]
        dests = _dests(6)
        assert c.get_into(keys, dests) == 6
        assert [d.tobytes() for d in dests] == [_content(k) for k in keys]
        assert c.stats()["requests"] - before <= 2   # the stats call and at most one note: no GET
        c.delete(keys[3:4])
        assert c.get_into(keys, _dests(6)) == 3      # a prefix ends at its first miss, as a leased get's
        stats = c.stats()
        assert stats["counters"]["get_chunks"] >= 9   # the daemon counts the gets the note told it of
        assert stats["errors"] == 0                   # and took every note without an error


def test_get_into_falls_back_to_a_leased_get_where_the_index_cannot_answer(daemon):
    for kwargs in ({"shared_index": False}, {"stream": False}, {}):
        with daemon.client(namespace="t", **kwargs) as c:
            keys = c.chunk_keys([len(kwargs)] * 256 * 3)
            c.put(keys, [_content(k) for k in keys])
            dests = _dests(3)
            assert c.get_into(keys, dests, verify=True) == 3   # verifying: always the leased path
            assert [d.tobytes() for d in dests] == [_content(k) for k in keys]
            assert c.get_into(keys, _dests(3)) == 3


def test_get_into_refuses_a_destination_smaller_than_its_chunk(daemon):
    with daemon.client(namespace="t") as c:
        keys = c.chunk_keys([1] * 256)
        c.put(keys, [_content(keys[0])])
        with pytest.raises(UsageError, match="destination 0 holds 100 bytes"):
            c.get_into(keys, [bytearray(100)])
        with pytest.raises(UsageError, match="2 keys but 1 destinations"):
            c.get_into(keys * 2, [bytearray(SIZE)])
        bigger = bytearray(SIZE + 10)
        assert c.get_into(keys, [bigger]) == 1 and bytes(bigger[:SIZE]) == _content(keys[0])


def test_get_into_fills_tensors_too(daemon):
    torch = pytest.importorskip("torch")
    with daemon.client(namespace="t") as c:
        keys = c.chunk_keys([2] * 256 * 2)
        c.put(keys, [_content(k) for k in keys])
        dests = [torch.zeros(SIZE // 4, dtype=torch.float32) for _ in keys]
        for kwargs in ({}, {"verify": True}):   # from the arena, and through a lease
            assert c.get_into(keys, dests, **kwargs) == 2
            assert [d.numpy().tobytes() for d in dests] == [_content(k) for k in keys]


def test_a_slot_reused_under_the_reader_is_never_read_as_the_old_chunk(start_daemon):
    """A writer keeps evicting (its puts need the room) the chunks a reader copies out of the arena: every chunk
    the reader keeps must be its own bytes, whole."""
    d = start_daemon("--host-mem", "8MiB", "--disk-size", "0")
    stop = threading.Event()
    errors: list[BaseException] = []
    written = [0]   # the writer's latest put: the reader reads the ones just before it, soon to be evicted

    def write() -> None:
        try:
            with d.client(namespace="t") as w:
                while not stop.is_set():
                    keys = w.chunk_keys([written[0] + 1] * 256 * 8)
                    w.put(keys, [_content(k) for k in keys])
                    written[0] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    kept = 0
    try:
        with d.client(namespace="t") as r:
            for i in range(600):
                keys = r.chunk_keys([max(1, written[0] - i % 24)] * 256 * 8)
                dests = _dests(8)
                n = r.get_into(keys, dests)
                for key, dest in zip(keys[:n], dests):
                    assert dest.tobytes() == _content(key)
                kept += n
    finally:
        stop.set()
        writer.join()
    assert not errors
    assert kept > 0


def test_queued_puts_are_seen_by_the_next_read_and_counted_at_flush(daemon):
    with daemon.client(namespace="t") as c:
        keys = c.chunk_keys(list(range(256 * 8)))
        data = [_content(k) for k in keys]
        assert c.put(keys[:4], data[:4], wait=False) is None
        assert c.put(keys[4:], data[4:], parent=keys[3], wait=False) is None
        dests = _dests(8)
        assert c.get_into(keys, dests) == 8
        assert [d.tobytes() for d in dests] == data
        assert c.flush() == 8
        assert c.put(keys, data, wait=False) is None and c.flush() == 0   # stored already
        more = c.chunk_keys([7] * 256 * 2)
        c.put(more, [_content(k) for k in more], wait=False)
        assert c.lookup(more) == 2   # a lookup from the shared index sees it too
        with c.get(more) as views:
            assert [bytes(v) for v in views] == [_content(k) for k in more]


def test_a_queued_put_the_daemon_refuses_raises_at_flush_and_stores_nothing(daemon):
    with daemon.client(namespace="t") as c:
        good = c.chunk_keys([3] * 256)
        c.put(good, [_content(good[0])])   # takes a credit
        twice = c.chunk_keys([9] * 256)[0]
        assert c.put([twice, twice], [b"x" * 5000] * 2, wait=False) is None   # the daemon refuses a key twice
        with pytest.raises(BadRequestError, match="same key twice"):
            c.flush()
        assert c.flush() == 0   # reported once
        keys = c.chunk_keys([4] * 256 * 2)
        assert c.put(keys, [_content(k) for k in keys]) == 2   # the client goes on putting
        assert c.lookup(keys) == 2


def test_a_queued_put_is_published_before_close(daemon):
    keys = None
    with daemon.client(namespace="t") as c:
        keys = c.chunk_keys([5] * 256 * 3)
        c.put(keys, [_content(k) for k in keys], wait=False)
    with daemon.client(namespace="t") as other:
        assert other.lookup(keys) == 3


def test_the_client_module_stays_importable_as_before():
    assert kvstore.Client is kvstore.client.client.Client
    assert {"Lease", "LookupResult", "Reservation"} <= set(kvstore.client.client.__all__)


def test_read_hands_the_prefix_to_a_copy_without_a_round_trip_and_again_when_it_changed(daemon):
    with daemon.client(namespace="t") as c:
        keys = c.chunk_keys([7] * 256 * 4)
        c.put(keys, [_content(k) for k in keys])
        seen: list[list[bytes]] = []
        before = c.stats()["requests"]
        assert c.read(keys, lambda views: seen.append([bytes(v) for v in views])) == 4
        assert seen == [[_content(k) for k in keys]]
        assert c.stats()["requests"] - before <= 2   # the stats call and at most one note: no GET

        # a chunk replaced under the first copy: the copy is made again, of what is there now
        seen.clear()

        def copy(views):
            seen.append([bytes(v) for v in views])
            if len(seen) == 1:
                c.delete(keys[2:])
                c.put(keys[2:3], [_content(keys[0])])   # other bytes under the same key, in another slot
        assert c.read(keys, copy) == 3
        assert len(seen) == 2 and seen[1] == [_content(keys[0]), _content(keys[1]), _content(keys[0])]
        assert c.read([], copy) == 0 and len(seen) == 2


def test_read_leases_the_chunks_where_the_index_cannot_answer(daemon):
    for kwargs in ({"shared_index": False}, {"stream": False}):
        with daemon.client(namespace="t", **kwargs) as c:
            keys = c.chunk_keys([8 + len(kwargs)] * 256 * 3)
            c.put(keys, [_content(k) for k in keys])
            seen: list[list[bytes]] = []
            assert c.read(keys, lambda views: seen.append([bytes(v) for v in views])) == 3  # noqa: B023 - called here
            assert seen == [[_content(k) for k in keys]]
            assert c.stats()["leases"] == 0   # released after the copy
