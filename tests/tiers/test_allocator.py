"""The extent allocator: mixed sizes, coalescing, bounded waste."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from kvstore.tiers.allocator import ExtentAllocator


def test_mixed_sizes_never_overlap_and_coalesce_fully():
    alloc = ExtentAllocator(256 << 20)
    rnd = random.Random(7)
    live: dict[int, int] = {}
    for _ in range(20_000):
        if live and rnd.random() < 0.45:
            off = rnd.choice(list(live))
            alloc.free(off)
            del live[off]
        else:
            size = rnd.choice([4096, 100_000, 256 << 10, 2 << 20, 32 << 20])
            off = alloc.allocate(size)
            if off is not None:
                live[off] = alloc.size_of(off)
    spans = sorted(live.items())
    for (a, la), (b, _) in pairwise(spans):
        assert a + la <= b
    assert alloc.used_bytes == sum(live.values())
    for off in list(live):
        alloc.free(off)
    stats = alloc.stats()
    assert stats.used_bytes == 0 and stats.free_extents == 1 and stats.largest_free_bytes == 256 << 20


def test_fills_to_capacity_with_one_size():
    alloc = ExtentAllocator(64 << 20)
    offs = [alloc.allocate(2 << 20) for _ in range(32)]
    assert None not in offs and alloc.allocate(1) is None
    alloc.free(offs[3])
    assert alloc.allocate(2 << 20) == offs[3]


def test_waste_is_bounded():
    alloc = ExtentAllocator(1 << 30)
    size = (3 << 20) + 12345
    off = alloc.allocate(size)
    assert alloc.size_of(off) - size < 4096


def test_bad_free_is_refused():
    alloc = ExtentAllocator(1 << 20)
    off = alloc.allocate(4096)
    alloc.free(off)
    with pytest.raises(ValueError):
        alloc.free(off)
    with pytest.raises(ValueError):
        alloc.free(123)
