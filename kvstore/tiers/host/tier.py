"""Host DRAM tier: a shared-memory arena carved up by the extent allocator.

Every extent handed out is backed by pages first (``SharedArena.reserve``): an extent the file system cannot back
is given back and the allocation fails as a full tier would (``backing_refused`` says so), so nothing is ever
written where a SIGBUS waits.
"""

from __future__ import annotations

from ...units import format_size
from ..allocator import ExtentAllocator, ExtentSpace, TierUsage
from ...mapped.arena import SharedArena
from .journal import SlotJournal

__all__ = ["HostTier", "TierUsage"]


class HostTier(ExtentSpace):
    name = "host"

    def __init__(self, arena: SharedArena) -> None:
        self.arena = arena
        self.allocator = ExtentAllocator(arena.size)
        self._view = arena.view()
        self.backing_refused = 0        # allocations refused because /dev/shm could not back their pages
        self.last_backing_refused = False
        self.journal: SlotJournal | None = None   # what a crash leaves for the next daemon (journal.py)

    def allocate(self, nbytes: int) -> int | None:
        """Byte offset of a fresh slot of at least ``nbytes``, backed by pages; None when no free extent is large
        enough or the file system cannot back it."""
        offset = self.allocator.allocate(nbytes)
        if offset is None or self.arena.reserve(offset, self.allocator.size_of(offset)):
            self.last_backing_refused = False
            if offset is not None and self.journal is not None:
                self.journal.flush()   # the FREE of a slot is written before the slot can be written again
            return offset
        self.allocator.free(offset)
        self.backing_refused += 1
        self.last_backing_refused = True
        return None

    def adopt(self, extents: list[tuple[int, int]]) -> list[int]:
        """Take the slots (offset, bytes) of a kept arena's chunks before anything else is allocated; returns the
        offsets taken (one that overlaps another or reaches past the tier is left out: see ``ExtentAllocator
        .adopt``)."""
        return self.allocator.adopt(extents)

    def free(self, offset: int) -> None:
        """Give the slot at ``offset`` back (the journal hears of it first)."""
        if self.journal is not None:
            self.journal.freed(offset)
        self.allocator.free(offset)

    def memory_fields(self) -> dict[str, str]:
        """What the ``ready`` line says of memory: the most the tier may take, and what it holds now."""
        return {"host_mem_max": format_size(self.capacity_bytes).replace(" ", ""),
                "host_mem_now": format_size(self.reserved_bytes).replace(" ", "")}

    @property
    def reserved_bytes(self) -> int:
        """Memory the arena holds now (its pages reserved so far); it grows up to ``capacity_bytes``."""
        return self.arena.reserved_bytes

    def read(self, offset: int, nbytes: int) -> memoryview:
        """A view of a stored chunk's bytes (valid while the chunk is pinned)."""
        return self._view[offset:offset + nbytes]

    def write(self, offset: int, data: bytes | memoryview) -> None:
        self._view[offset:offset + len(data)] = data

    def close(self, keep: bool = False) -> None:
        """Unmap the arena; ``keep`` leaves its file for the next daemon to adopt (the journal goes either way:
        a kept arena is described instead)."""
        if self.journal is not None:
            self.journal.close()
        self._view.release()
        self.arena.close(keep=keep)
