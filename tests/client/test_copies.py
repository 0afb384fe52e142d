"""Batches of chunk copies split over two threads (client/copies.py): every byte lands where it belongs, a failed
half is raised only once both halves are done, and puts and gets of large batches through a daemon (credit,
reserve + commit, index-served and leased gets) give back what was put."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kvstore.client import copies
from kvstore.client.buffers import copy_into, copy_out
from kvstore.client.copies import PARALLEL_FROM, _half_by_bytes, copy_batch

MIB = 1 << 20


def _batch(n: int, size: int) -> tuple[list[np.ndarray], bytearray]:
    sources = [np.full(size, i + 1, dtype=np.uint8) for i in range(n)]
    return sources, bytearray(n * size)


def test_a_large_batch_is_split_over_two_threads_and_every_byte_lands_in_place():
    n, size = 8, PARALLEL_FROM // 4
    sources, target = _batch(n, size)
    view = memoryview(target)
    threads: list[str] = []

    def copy(i: int, source: np.ndarray, gil_free: bool = False) -> None:
        threads.append(threading.current_thread().name)
        copy_into(view[i * size:(i + 1) * size], source, gil_free)

    copy_batch(copy, list(enumerate(sources)), [size] * n)
    assert bytes(target) == b"".join(s.tobytes() for s in sources)
    assert len(set(threads)) == 2 and threads.count(threading.current_thread().name) == n // 2


def test_a_small_batch_stays_on_the_calling_thread():
    sources, target = _batch(4, 64 << 10)
    threads: list[str] = []
    view = memoryview(target)

    def copy(i: int, source: np.ndarray, gil_free: bool = False) -> None:
        threads.append(threading.current_thread().name)
        copy_out(view[i * (64 << 10):(i + 1) * (64 << 10)], memoryview(source), gil_free)

    copy_batch(copy, list(enumerate(sources)), [64 << 10] * 4)
    assert set(threads) == {threading.current_thread().name}
    assert bytes(target) == b"".join(s.tobytes() for s in sources)


@pytest.mark.parametrize("failing", [0, 3])
def test_a_failed_half_is_raised_once_both_halves_are_done(failing):
    done: list[int] = []
    failed = threading.Event()

    def copy(i: int, _: None, gil_free: bool = False) -> None:
        if i == failing:
            failed.set()
            raise ValueError(f"copy {i} failed")
        if i >= 2 and failing < 2:   # the helper's half is still copying when the other half fails
            assert failed.wait(10)
        done.append(i)

    with pytest.raises(ValueError, match=f"copy {failing} failed"):
        copy_batch(copy, [(i, None) for i in range(4)], [PARALLEL_FROM // 2] * 4)
    # halves [0, 1] here and [2, 3] on the helper; a half stops at its failed copy, the other runs to its end
    assert sorted(done) == {0: [2, 3], 3: [0, 1, 2]}[failing]


def test_the_cut_is_near_half_the_bytes_and_never_leaves_a_half_empty():
    assert _half_by_bytes([1] * 4, 4) == 2
    assert _half_by_bytes([10, 1, 1, 1], 13) == 1
    assert _half_by_bytes([1, 1, 1, 10], 13) == 3
    assert _half_by_bytes([5, 5], 10) == 1
    assert _half_by_bytes([100, 1], 101) == 1


def test_large_batches_round_trip_through_a_daemon(start_daemon):
    d = start_daemon("--host-mem", "256MiB")
    n, size = 8, 2 * MIB   # 16 MiB: past PARALLEL_FROM
    payloads = [np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8) for i in range(n)]
    for kwargs in ({}, {"credits": False}):
        with d.client(namespace=f"big-{len(kwargs)}", **kwargs) as c:
            keys = c.chunk_keys(list(range(256 * n)))
            assert c.put(keys, payloads) == n
            dests = [np.zeros(size, dtype=np.uint8) for _ in range(n)]
            assert c.get_into(keys, dests) == n                   # from the arena, through the index
            assert all(np.array_equal(p, q) for p, q in zip(payloads, dests))
            dests = [np.zeros(size, dtype=np.uint8) for _ in range(n)]
            assert c.get_into(keys, dests, verify=True) == n      # the leased path
            assert all(np.array_equal(p, q) for p, q in zip(payloads, dests))
            assert c.stats()["errors"] == 0
    assert copies._helper is not None
