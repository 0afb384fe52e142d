"""The lookup index's walk in C (``native/kvstore_index.c``, built into ``_kvstore_index.so``), where it was built.

The walk in ``mapped/index_reader.py`` is a few Python steps per key, and a scheduler asks between passes, in a
process whose caches have gone cold; under several engines at once those walks are what their lookups wait on.
The C walk is the same walk, slot for slot (the same probe order and bound, the same sequence-lock read of each
slot), in one call through ctypes; a lookup takes only the count per tier back (``lookup``: with the header's
checks and the epoch's second read in the same call), a located read also each chunk's slot, sequence, offset
and size. ``bench/client_throughput.py`` measures it next to the Python walk.

Without the library (no compiler when kvstore was built, or ``KVSTORE_NATIVE=off``) the Python walk answers,
with the same answers (``tests/client/test_shared_index.py`` runs both).
"""

from __future__ import annotations

import ctypes
import mmap
import threading
from typing import Any, Literal

import numpy as np

from ..protocol.index_layout import HEADER_BYTES, MAX_PROBE, STALE_NS
from . import load

STATES = 5   # EMPTY, TOMBSTONE, DISK, HOST, GPU: counts are indexed by state
# (stopped at a key not listed, leading keys listed, count per state, then per listed key — when asked for —
# slot offset, seq, host, size)
WalkRead = tuple[bool, int, list[int], list[int], list[int], list[int], list[int]]


class NativeWalk:
    """The C walk over one mapped index file."""

    def __init__(self, lib: ctypes.CDLL, buf: mmap.mmap, ns_mask: int = 0) -> None:
        self._ns_mask = ns_mask   # the reader's namespace (``binding.py``): each key is bound as it is walked
        self._fn = lib.kvstore_index_walk
        self._lookup = lib.kvstore_index_lookup
        self._export: Any = np.frombuffer(buf, dtype=np.uint8)   # the mapping's address (a read-only mapping)
        self._address = self._export.ctypes.data
        self._scratch = threading.local()   # the call lets go of the GIL: each thread has its own out-buffers

    @classmethod
    def open(cls, buf: mmap.mmap, ns_mask: int = 0) -> "NativeWalk | None":
        """The C walk over ``buf`` for a reader of the namespace whose mask is ``ns_mask``, or None (not built)."""
        lib = load("index")
        return None if lib is None else cls(lib, buf, ns_mask)

    def walk(self, packed: bytes, n: int, mask: int, detail: bool = True) -> WalkRead | Literal[False] | None:
        """What the walk of the ``n`` keys in ``packed`` read (``detail``: with each listed key's slot), or False
        (a slot changed while read: try again) or None (a key probed past MAX_PROBE: ask the socket)."""
        scratch = self._buffers()
        out = (ctypes.c_uint64 * (4 * n))() if detail else None
        got = self._fn(self._address, HEADER_BYTES, mask, packed, n, MAX_PROBE, out, scratch.counts,
                       ctypes.byref(scratch.missed), self._ns_mask)
        if got < 0:
            return False if got == -1 else None
        flat = out[:4 * got] if out is not None else []
        return bool(scratch.missed.value), got, scratch.counts[:], flat[0::4], flat[1::4], flat[2::4], flat[3::4]

    def lookup(self, packed: bytes, n: int, promote: bool) -> tuple[int, list[int]] | Literal[False] | None:
        """``SharedIndexView.answer``'s one try in one call (the header's checks, the walk, the epoch read again,
        the promote rule): (leading keys listed, count per state), False (the table moved: try again) or None
        (only the socket can answer)."""
        scratch = self._buffers()
        got = self._lookup(self._address, HEADER_BYTES, packed, n, MAX_PROBE, STALE_NS, promote, scratch.counts,
                           self._ns_mask)
        if got < 0:
            return False if got == -1 else None
        return got, scratch.counts[:]

    def _buffers(self) -> threading.local:
        """This thread's out-buffers (the calls let go of the GIL)."""
        scratch = self._scratch
        if not hasattr(scratch, "counts"):
            scratch.counts, scratch.missed = (ctypes.c_uint64 * STATES)(), ctypes.c_int64()
        return scratch

    def close(self) -> None:
        self._export = None   # the export must go before the mapping closes
