"""Extent allocator for one contiguous arena: two-level segregated fit (TLSF).

Chunk sizes differ between models (a 256-token chunk is 32 MiB for Llama-3-8B, 128 MiB for Llama-2-7B, a few
hundred KiB for a small model), so the arena must serve mixed sizes. Free extents are kept in size classes: a
first level per power of two and ``2**SL_BITS`` linear sub-classes inside each, with a bitmap of non-empty
classes. An allocation rounds its size up to the next class boundary, so that *any* extent in the first
non-empty class at or above it fits: no list walk, O(1) per operation (bit tricks on a small integer). The cost
is internal waste of at most 1/2**SL_BITS (12.5 %) of the request when the exact class is empty; splitting keeps
the remainder. Frees coalesce with both neighbours through two maps (start → size, end → start), so
fragmentation stays bounded by the live set rather than by history.

Everything is in units of ``align`` bytes (a page by default, which also suits O_DIRECT and DMA).
"""

from __future__ import annotations

from dataclasses import dataclass

SL_BITS = 3


def _size_class(units: int) -> int:
    """The class an extent of ``units`` belongs to (used when inserting free extents)."""
    if units < (1 << SL_BITS):
        return units
    fl = units.bit_length() - 1
    sl = (units >> (fl - SL_BITS)) - (1 << SL_BITS)
    return ((fl - SL_BITS + 1) << SL_BITS) + sl


def _search_class(units: int) -> int:
    """The lowest class all of whose extents hold at least ``units``."""
    if units >= (1 << SL_BITS):
        fl = units.bit_length() - 1
        units += (1 << (fl - SL_BITS)) - 1
    return _size_class(units)


@dataclass(frozen=True)
class AllocatorStats:
    capacity_bytes: int
    used_bytes: int
    free_extents: int
    largest_free_bytes: int


class ExtentAllocator:
    """Allocates aligned byte ranges of one arena of ``capacity`` bytes."""

    def __init__(self, capacity: int, align: int = 4096) -> None:
        if align <= 0 or align & (align - 1):
            raise ValueError("align must be a power of two")
        self.align = align
        self.total_units = capacity // align
        self.capacity = self.total_units * align
        self._free_start: dict[int, int] = {}   # start unit → length in units
        self._free_end: dict[int, int] = {}     # end unit (exclusive) → start unit
        self._bins: dict[int, dict[int, None]] = {}  # class → ordered set of start units
        self._nonempty = 0                       # bitmap of classes with free extents
        self._allocated: dict[int, int] = {}     # start unit → length in units
        self.used_units = 0
        if self.total_units:
            self._insert_free(0, self.total_units)

    # -- public -------------------------------------------------------------------------------------------
    def units_for(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.align))

    def allocate(self, nbytes: int) -> int | None:
        """Byte offset of a fresh extent of at least ``nbytes``, or None if no free extent is large enough."""
        units = self.units_for(nbytes)
        start = self._find_extent(units)
        if start is None:
            return None
        length = self._free_start[start]
        self._remove_free(start, length)
        if length > units:
            self._insert_free(start + units, length - units)
        self._allocated[start] = units
        self.used_units += units
        return start * self.align

    def free(self, offset: int) -> None:
        """Return the extent that ``allocate`` gave at ``offset``."""
        start = offset // self.align
        units = self._allocated.pop(start, None)
        if units is None or offset % self.align:
            raise ValueError(f"offset {offset} is not an allocated extent")
        self.used_units -= units
        end = start + units
        prev_start = self._free_end.get(start)
        if prev_start is not None:
            self._remove_free(prev_start, start - prev_start)
            start = prev_start
        next_len = self._free_start.get(end)
        if next_len is not None:
            self._remove_free(end, next_len)
            end += next_len
        self._insert_free(start, end - start)

    def split(self, offset: int, at: int) -> None:
        """Cut the allocated extent at ``offset`` in two at byte ``at``; both halves stay allocated and are freed
        on their own (a put credit hands out the chunks written into it this way: ``store/credits.py``)."""
        start, cut = offset // self.align, at // self.align
        units = self._allocated.get(start)
        if units is None or offset % self.align or at % self.align or not start < cut < start + units:
            raise ValueError(f"cannot split the extent at {offset} at {at}")
        self._allocated[start] = cut - start
        self._allocated[cut] = start + units - cut

    def adopt(self, extents: list[tuple[int, int]]) -> list[int]:
        """Mark ``extents`` (byte offset, bytes) allocated in a fresh allocator, the rest free: the slots of a
        kept arena's chunks (``store/adoption.py``). Extents that are misaligned, reach past the capacity
        or overlap one at a lower offset are skipped. Returns the offsets taken.
        Raises ValueError when anything is allocated already."""
        if self._allocated:
            raise ValueError("adopt needs an allocator with nothing allocated")
        taken: dict[int, int] = {}
        busy: list[tuple[int, int]] = []
        for offset, nbytes in extents:
            start, units = offset // self.align, self.units_for(nbytes)
            if offset % self.align or offset < 0 or start + units > self.total_units:
                continue
            busy.append((start, units))
        busy.sort()
        end_of_last = 0
        for start, units in busy:
            if start >= end_of_last:
                taken[start] = units
                end_of_last = start + units
        self._free_start.clear()
        self._free_end.clear()
        self._bins.clear()
        self._nonempty = 0
        at = 0
        for start, units in sorted(taken.items()):
            if start > at:
                self._insert_free(at, start - at)
            at = start + units
        if at < self.total_units:
            self._insert_free(at, self.total_units - at)
        self._allocated = taken
        self.used_units = sum(taken.values())
        return [start * self.align for start in taken]

    def size_of(self, offset: int) -> int:
        return self._allocated[offset // self.align] * self.align

    @property
    def extents(self) -> int:
        """How many allocated extents are live (a tier's chunk or slot count)."""
        return len(self._allocated)

    @property
    def used_bytes(self) -> int:
        return self.used_units * self.align

    def stats(self) -> AllocatorStats:
        largest = max(self._free_start.values(), default=0)
        return AllocatorStats(self.capacity, self.used_bytes, len(self._free_start), largest * self.align)

    # -- free-extent bookkeeping ----------------------------------------------------------------------------
    def _find_extent(self, units: int) -> int | None:
        want = _search_class(units)
        candidates = self._nonempty >> want
        if candidates:
            cls = want + (candidates & -candidates).bit_length() - 1
            return next(iter(self._bins[cls]))
        # Last resort when the arena is nearly full: an extent in the request's own class may still fit.
        # Bounded by the size of that one class, and only reached when the O(1) path has nothing.
        for start in self._bins.get(_size_class(units), ()):
            if self._free_start[start] >= units:
                return start
        return None

    def _insert_free(self, start: int, length: int) -> None:
        self._free_start[start] = length
        self._free_end[start + length] = start
        cls = _size_class(length)
        self._bins.setdefault(cls, {})[start] = None
        self._nonempty |= 1 << cls

    def _remove_free(self, start: int, length: int) -> None:
        del self._free_start[start]
        del self._free_end[start + length]
        cls = _size_class(length)
        members = self._bins[cls]
        del members[start]
        if not members:
            del self._bins[cls]
            self._nonempty &= ~(1 << cls)


@dataclass(frozen=True)
class TierUsage:
    capacity_bytes: int
    used_bytes: int
    chunks: int


class ExtentSpace:
    """What every memory tier (host arena, GPU pool) answers from its extent allocator ``self.allocator``:
    capacity, use, how many chunks, allocate and free. Subclasses add where the bytes are."""

    allocator: ExtentAllocator

    @property
    def capacity_bytes(self) -> int:
        return self.allocator.capacity

    @property
    def used_bytes(self) -> int:
        return self.allocator.used_bytes

    @property
    def chunks(self) -> int:
        return self.allocator.extents

    def allocate(self, nbytes: int) -> int | None:
        """Byte offset of a fresh slot of at least ``nbytes``, or None when no free extent is large enough."""
        return self.allocator.allocate(nbytes)

    def free(self, offset: int) -> None:
        self.allocator.free(offset)

    def split(self, offset: int, at: int) -> None:
        self.allocator.split(offset, at)

    def usage(self) -> TierUsage:
        return TierUsage(self.capacity_bytes, self.used_bytes, self.chunks)
