"""Host DRAM tier: a shared-memory arena carved up by the extent allocator."""

from __future__ import annotations

from .allocator import ExtentAllocator, ExtentSpace, TierUsage
from .arena import SharedArena

__all__ = ["HostTier", "TierUsage"]


class HostTier(ExtentSpace):
    name = "host"

    def __init__(self, arena: SharedArena) -> None:
        self.arena = arena
        self.allocator = ExtentAllocator(arena.size)
        self._view = arena.view()

    def read(self, offset: int, nbytes: int) -> memoryview:
        """A view of a stored chunk's bytes (valid while the chunk is pinned)."""
        return self._view[offset:offset + nbytes]

    def write(self, offset: int, data: bytes | memoryview) -> None:
        self._view[offset:offset + len(data)] = data

    def close(self) -> None:
        self._view.release()
        self.arena.close()
