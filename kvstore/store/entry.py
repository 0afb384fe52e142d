"""The record the index keeps per chunk."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class State(enum.IntEnum):
    RESERVED = 1    # space allocated, writer copying bytes in; invisible to readers
    COMMITTED = 2   # complete and readable


@dataclass(eq=False, slots=True)
class Entry:
    key: bytes
    size: int
    namespace: str
    parent: bytes | None
    state: State
    host_offset: int | None = None
    pins: int = 0          # one per lease holding this chunk; see Store._pin / Store._unpin
    doomed: bool = False   # deleted while pinned: freed by the last unpin

    @property
    def readable(self) -> bool:
        return self.state is State.COMMITTED and not self.doomed
