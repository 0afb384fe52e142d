"""Populating the arena mapping where a request touches it, instead of all of it at connect.

A client maps the daemon's whole arena (the host tier: gigabytes, a quarter of the machine by default).
Mapping it with ``MAP_POPULATE`` made connect time grow with the arena (``bench/connect_time.py`` measures it)
for pages most clients never touch. Mapping lazily makes connect constant, but then each
first touch of a 4 KiB page is a minor fault, which slows the first put or get into fresh slots. So the
client asks the kernel to populate the range a request is about to copy into or hand out, once per 2 MiB
granule of its mapping, with one ``madvise(MADV_POPULATE_READ)`` call per run of untouched granules: the
same page-table work as ``MAP_POPULATE``, paid only for the slots used, in one system call per run instead of
one fault per page. READ rather than WRITE: the read path maps 16 pages a step (fault-around) and on a shared
tmpfs mapping the entries it makes are writable already, so a later write takes no fault, and populating for
reading does less page-table work than for writing, both far less than one fault per page. It never changes the
bytes. On a kernel older than 5.14 the call fails once and pages are faulted in on touch as before.

Cost per request: one slice count over a bytearray per slot (a granule bitmap, 1 byte per 2 MiB of arena).
"""

from __future__ import annotations

import mmap

GRANULE = 2 << 20
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)   # Linux 5.14+; Python 3.11's mmap lacks it


class PagePopulator:
    """Which granules of one mapping are populated; ``touch`` populates those a range needs."""

    def __init__(self, buf: mmap.mmap, size: int) -> None:
        self._buf = buf
        self._size = size
        self._done = bytearray(-(-size // GRANULE))
        self.supported = True

    def touch(self, offset: int, length: int) -> None:
        if length <= 0 or not self.supported:
            return
        first, last = offset // GRANULE, (offset + length - 1) // GRANULE
        if self._done.find(0, first, last + 1) < 0:
            return   # the common case once warm: everything already populated
        g = first
        while g <= last:
            if self._done[g]:
                g += 1
                continue
            end = g
            while end + 1 <= last and not self._done[end + 1]:
                end += 1
            self._populate(g, end)
            g = end + 1

    def touch_many(self, ranges: list[tuple[int, int]]) -> None:
        """``touch`` of each (offset, length); one test of the whole span when all of it is populated already."""
        if not ranges or not self.supported:
            return
        low = min(offset for offset, _ in ranges)
        high = max(offset + length for offset, length in ranges)
        if high > low and self._done.find(0, low // GRANULE, (high - 1) // GRANULE + 1) < 0:
            return
        for offset, length in ranges:
            self.touch(offset, length)

    def _populate(self, first: int, last: int) -> None:
        start = first * GRANULE
        length = min((last + 1) * GRANULE, self._size) - start
        try:
            self._buf.madvise(MADV_POPULATE_READ, start, length)
        except (OSError, ValueError):
            self.supported = False   # an old kernel: first touches fault pages in one by one
            return
        self._done[first:last + 1] = b"\x01" * (last + 1 - first)
