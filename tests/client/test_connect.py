"""Connecting maps the arena without populating it; a request populates just the slots it touches.

The measure is the client's own page tables (``Rss`` of its arena mapping in /proc/self/smaps), not a clock:
connect time then cannot grow with the arena (bench/connect_time.py has the figures).
"""

from __future__ import annotations

import mmap

from kvstore.client.pages import GRANULE, PagePopulator

MiB = 1 << 20


def mapped_rss(path: str) -> int:
    """Bytes of ``path`` resident in this process's page tables, over all its mappings."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:   # a mapping's header line
                inside = line.rstrip().endswith(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def test_connect_populates_nothing_and_a_put_only_its_slots(start_daemon):
    d = start_daemon("--host-mem", "256MiB", "--disk-size", "0")
    with d.client(namespace="pages") as c:
        arena = c.server_info["arena"]["path"]
        assert mapped_rss(arena) == 0
        keys = c.chunk_keys(list(range(512)))
        c.put(keys, [b"a" * MiB, b"b" * MiB])
        after_put = mapped_rss(arena)
        assert 2 * MiB <= after_put <= 4 * GRANULE
        with c.get(keys) as views:
            assert [bytes(v[:1]) for v in views] == [b"a", b"b"]
        assert mapped_rss(arena) <= 4 * GRANULE < 256 * MiB


def test_populator_touches_each_granule_once_and_only_those_asked_for():
    size = 16 * GRANULE
    with mmap.mmap(-1, size, flags=mmap.MAP_SHARED) as buf:
        pages = PagePopulator(buf, size)
        pages.touch(GRANULE + 10, 2 * GRANULE)          # granules 1..3
        assert list(pages._done[:5]) == [0, 1, 1, 1, 0]
        pages.touch(0, 1)
        pages.touch(size - 1, 1)
        assert list(pages._done) == [1, 1, 1, 1] + [0] * 11 + [1]
        pages.touch(0, 4 * GRANULE)                       # all done: no call
        pages.touch(5, 0)


def test_populator_handles_a_last_granule_cut_short():
    size = 3 * GRANULE - 4096   # the last granule is partial: madvise must stop at the mapping's end
    with mmap.mmap(-1, size, flags=mmap.MAP_SHARED) as buf:
        pages = PagePopulator(buf, size)
        pages.touch(size - 1, 1)
        pages.touch(0, size)
        assert pages.supported and list(pages._done) == [1, 1, 1]


def test_populate_arena_maps_the_whole_arena_once_asked(start_daemon):
    d = start_daemon("--host-mem", "64MiB", "--disk-size", "0")
    with d.client(namespace="pages") as c:
        arena = c.server_info["arena"]["path"]
        assert mapped_rss(arena) == 0
        assert c.populate_arena() == c.server_info["arena"]["size"]
        assert mapped_rss(arena) >= 64 * MiB
        assert c.populate_arena() == c.server_info["arena"]["size"]   # again: nothing left to do
    with d.client(namespace="pages", stream=False, shared_index=False) as c:
        assert c.populate_arena() == c.server_info["arena"]["size"]


def test_touch_many_populates_each_range_and_skips_a_populated_span():
    size = 8 * GRANULE
    with mmap.mmap(-1, size, flags=mmap.MAP_SHARED) as buf:
        pages = PagePopulator(buf, size)
        pages.touch_many([(10, 1), (5 * GRANULE, GRANULE + 1)])
        assert list(pages._done) == [1, 0, 0, 0, 0, 1, 1, 0]
        pages.touch_many([(0, 1), (6 * GRANULE, 5)])   # all populated already
        pages.touch_many([])
        assert list(pages._done) == [1, 0, 0, 0, 0, 1, 1, 0]
