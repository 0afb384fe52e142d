"""Host DRAM tier: a shared-memory arena carved up by the extent allocator."""

from __future__ import annotations

from dataclasses import dataclass

from .allocator import ExtentAllocator
from .arena import SharedArena


@dataclass(frozen=True)
class TierUsage:
    capacity_bytes: int
    used_bytes: int
    chunks: int


class HostTier:
    name = "host"

    def __init__(self, arena: SharedArena) -> None:
        self.arena = arena
        self.allocator = ExtentAllocator(arena.size)
        self._view = arena.view()

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
        return self.allocator.allocate(nbytes)

    def free(self, offset: int) -> None:
        self.allocator.free(offset)

    def read(self, offset: int, nbytes: int) -> memoryview:
        """A view of a stored chunk's bytes (valid while the chunk is pinned)."""
        return self._view[offset:offset + nbytes]

    def write(self, offset: int, data: bytes | memoryview) -> None:
        self._view[offset:offset + len(data)] = data

    def usage(self) -> TierUsage:
        return TierUsage(self.capacity_bytes, self.used_bytes, self.chunks)

    def close(self) -> None:
        self._view.release()
        self.arena.close()
