"""The published index's placement of new keys in C (``native/kvstore_index.c``), where it was built.

A put of many chunks lists as many new keys. In CPython each costs a probe of the table and a slot written word
by word under its sequence lock, on the daemon's one thread, before the put's reply can go out (the reply must
not come before a reader can find the chunks). The C placement does the same for the whole batch in one call:
the same slot for each key as the Python writer chooses, written under the same lock.

Without the library (see ``kvstore.native``) ``PublishedIndex`` places keys in Python.
"""

from __future__ import annotations

import ctypes
import mmap
from array import array
from typing import Any, Sequence

import numpy as np

from ..protocol.index_layout import HEADER_BYTES, MAX_PROBE
from . import load


class NativePlace:
    """The C placement over the writer's mapping of the index file."""

    def __init__(self, lib: ctypes.CDLL, buf: mmap.mmap) -> None:
        self._fn = lib.kvstore_index_place
        self._export: Any = np.frombuffer(buf, dtype=np.uint8)   # the mapping's address
        self._address = self._export.ctypes.data

    @classmethod
    def open(cls, buf: mmap.mmap) -> "NativePlace | None":
        lib = load("index")
        return None if lib is None else cls(lib, buf)

    def place(self, keys: Sequence[bytes], listings: Sequence[tuple[int, int, int]],
              mask: int) -> tuple[list[int], int]:
        """Place each of ``keys`` (none of which holds a slot) with its listing; returns the slot each took (-1:
        none free within MAX_PROBE) and how many of those were tombstones."""
        n = len(keys)
        flat = array("Q", [word for listing in listings for word in listing])   # array: far cheaper than ctypes'
        slots = array("q", bytes(8 * n))
        reused = self._fn(self._address, HEADER_BYTES, mask, b"".join(keys), flat.buffer_info()[0], n, MAX_PROBE,
                          slots.buffer_info()[0])
        return slots.tolist(), reused

    def close(self) -> None:
        self._export = None   # the export must go before the mapping closes
