"""The record the index keeps per chunk."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ..protocol.engine_blocks import EngineBlocks
from ..protocol.retention import Retention


class State(enum.IntEnum):
    RESERVED = 1    # space allocated, writer copying bytes in; invisible to readers
    COMMITTED = 2   # complete and readable


class DiskState(enum.IntEnum):
    NONE = 0        # no copy on disk (disk tier off, write skipped, or the disk copy was evicted)
    QUEUED = 1      # waiting in the write-back queue
    WRITING = 2     # a worker is writing it from its host slot (the slot must not be freed)
    STORED = 3      # a complete, renamed file holds it


@dataclass(eq=False, slots=True)
class Entry:
    key: bytes
    size: int
    namespace: str
    parent: bytes | None
    state: State
    host_offset: int | None = None
    pins: int = 0          # one per lease holding this chunk; see Store.pin / Store.unpin_chain
    doomed: bool = False   # deleted while pinned or busy with I/O: freed when the last of those ends
    disk: DiskState = DiskState.NONE
    disk_bytes: int = 0    # bytes charged to the disk tier for this chunk (0 when none)
    loading: Any = None    # while being filled from disk or from the GPU tier: the host offset being filled
    gpu_offset: int | None = None   # slot in the GPU tier's pool, when a copy lives there
    gpu_loading: int | None = None  # while being promoted from DRAM: the GPU slot being filled
    hits: int = 0          # gets that found it; the second one in DRAM asks for promotion to the GPU tier
    checksum: int | None = None   # xxh3-64 of the bytes as committed (None until computed, see integrity.py)
    checking: int = 0      # checks reading its host slot now (the slot must not be freed or reused meanwhile)
    engine: EngineBlocks | None = None   # the engine's block hashes and token ids, for the KV cache events
    tenant: str = "default"   # the tenant its DRAM bytes are charged to (tenant_budgets.py)
    dram_charge: int = 0      # bytes charged to that tenant while it holds a DRAM slot
    retention: Retention = Retention.NORMAL   # its class in the DRAM eviction order (store/retention.py)
    pin_until: float = 0.0    # while soft-pinned: the pin's deadline on the Store's clock (0: not pinned)

    @property
    def readable(self) -> bool:
        return self.state is State.COMMITTED and not self.doomed

    @property
    def busy(self) -> bool:
        """Whether some operation still uses a slot or the file (so none of them may be freed yet)."""
        return (self.pins > 0 or self.disk is DiskState.WRITING or self.loading is not None
                or self.gpu_loading is not None or self.checking > 0)

    def learn_checksum(self, value: int | None) -> None:
        """Record the checksum of the chunk's bytes, if none is known yet.

        Every source (the hash worker, a disk file's record, a remote record, a kept DRAM arena) describes the
        same committed bytes, so the first one known stays: a later one could only disagree through damage,
        which the checks of the reads catch.
        """
        if self.checksum is None:
            self.checksum = value
