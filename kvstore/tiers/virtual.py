"""Payload-less tiers for ``kvstore simulate``: the real accounting, no bytes.

A capacity planner must answer "what would this daemon hit with these tier sizes" with the daemon's own index,
allocator, eviction and write-back bookkeeping, but without the memory or disk it plans for. So these classes
keep every piece of state the Store reads (the extent allocator of the host tier; the disk tier's capacity,
charge and per-chunk footprint) and drop only the payloads: ``VirtualArena`` maps nothing, ``VirtualDisk``
opens no file. The Store and the policies cannot tell them from the real tiers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ..protocol.engine_blocks import EngineBlocks
from ..protocol.key_params import KeyParams
from ..protocol.retention import Retention
from .disk.tier import DiskTier, ScanResult
from .host.tier import HostTier

if TYPE_CHECKING:
    from .gpu.tier import GpuTier
    from ..mapped.arena import SharedArena


class VirtualArena:
    """Stands in for ``SharedArena`` under a ``HostTier``: a size, and an empty view (no chunk is ever read)."""

    path = "(simulated)"

    def __init__(self, size: int) -> None:
        self.size = size
        self.owner = False

    def view(self) -> memoryview:
        return memoryview(b"")

    def reserve(self, offset: int, nbytes: int) -> bool:
        """Nothing to back: every extent is as good as reserved."""
        return True

    @property
    def reserved_bytes(self) -> int:
        return 0

    def close(self) -> None:
        pass


class VirtualDisk(DiskTier):
    """A disk tier that charges and uncharges like the real one (same footprint per chunk) and stores nothing."""

    def __init__(self, capacity_bytes: int) -> None:  # no directory to create, no O_DIRECT probe
        self.directory = "(simulated)"
        self.capacity_bytes = capacity_bytes
        self.compress = False
        self.direct = False
        self.used_bytes = 0
        self.chunks = 0

    def write(self, key: bytes, namespace: str, slot: memoryview, size: int, expected: int | None = None,
              parent: bytes | None = None, engine: EngineBlocks | None = None,
              retention: Retention = Retention.NORMAL, params: KeyParams | None = None) -> int:
        return size

    def read_into(self, key: bytes, slot: memoryview, size: int) -> int:
        raise NotImplementedError("a simulated disk holds no bytes to read")

    def remove(self, key: bytes) -> None:
        pass

    def quarantine(self, key: bytes, reason: str) -> None:
        pass

    def scan(self, workers: int = 8) -> ScanResult:
        return ScanResult()


def virtual_host_tier(size: int) -> HostTier:
    """A host tier of ``size`` bytes over a ``VirtualArena``: the real allocator, no memory."""
    return HostTier(cast("SharedArena", VirtualArena(size)))


def virtual_gpu_tier(size: int) -> "GpuTier":
    """A GPU tier's accounting for the simulator: the Store and its GPU ledger use only its extent allocator,
    which a payload-less host tier has too."""
    return cast("GpuTier", virtual_host_tier(size))
