"""The record the index keeps per chunk."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


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
    pins: int = 0          # one per lease holding this chunk; see Store._pin / Store._unpin
    doomed: bool = False   # deleted while pinned or busy with I/O: freed when the last of those ends
    disk: DiskState = DiskState.NONE
    disk_bytes: int = 0    # bytes charged to the disk tier for this chunk (0 when none)
    loading: Any = None    # while being promoted from disk: the host offset being filled

    @property
    def readable(self) -> bool:
        return self.state is State.COMMITTED and not self.doomed

    @property
    def busy(self) -> bool:
        """Whether some operation still uses the host slot or the file (so neither may be freed yet)."""
        return self.pins > 0 or self.disk is DiskState.WRITING or self.loading is not None
