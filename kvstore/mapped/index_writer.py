"""The lookup index, published in shared memory for clients to read without a round trip (the writer side).

The Store calls ``set`` and ``remove`` whenever a key's readable state changes (``Store.sync``): committed in
some tier, moved between tiers, or gone. Only readable chunks are listed, so a reader can never be told a
reserved or half-written chunk is there. The table layout and its lock-free read protocol are described in
``protocol/index_layout.py``; the reader is ``mapped/index_reader.py``.

Cost per change on the event loop: a dict update and a few 8-byte stores (O(1); a new key probes at most
``MAX_PROBE`` slots). The table grows by rebuilding in place under the table-wide ``epoch`` lock when live keys
and tombstones pass ``REBUILD_LOAD`` of its slots: O(keys) once per doubling, during which readers ask the socket.
The writer keeps its own maps (key → slot, key → state), so it never reads the table back.
"""

from __future__ import annotations

import mmap
import os
import time
from typing import Sequence

from ..protocol.index_layout import (
    CLOSED, EMPTY, FILE_BYTES, H_EPOCH, H_FLAGS, H_HEARTBEAT, H_MAGIC, H_PID, H_SLOTS, H_VERSION, HEADER_BYTES,
    LAYOUT_VERSION, MAGIC, MAX_PROBE, MAX_SLOTS, MIN_SLOTS, SLOT_BYTES, SLOT_WORDS, TOMBSTONE,
)

from ..native.place import NativePlace

Listing = tuple[int, int, int]   # a slot's state, host (DRAM offset + 1, 0: none), size
_GONE: Listing = (TOMBSTONE, 0, 0)
_EMPTY: Listing = (EMPTY, 0, 0)
REBUILD_LOAD = 0.5       # rebuild when live keys + tombstones pass this share of the slots
TARGET_LOAD = 0.25       # a rebuilt table holds its live keys at about this load


def _listing(state: int, host: int | None, size: int) -> Listing:
    return (state, 0 if host is None else host + 1, size if host is not None else 0)


def index_path_for(socket_path: str) -> str:
    """The index file of the daemon on ``socket_path``: the arena's sibling in /dev/shm."""
    from .arena import arena_path_for

    return arena_path_for(socket_path)[:-len(".arena")] + ".index"


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def slots_for(expected_keys: int) -> int:
    """A table size that holds ``expected_keys`` at the target load, within the layout's bounds."""
    return min(MAX_SLOTS, max(MIN_SLOTS, _pow2_at_least(int(expected_keys / TARGET_LOAD))))


def close_predecessor(path: str) -> None:
    """Mark the index file a killed daemon left CLOSED, then remove it. A client that still maps it then knows
    its daemon is gone before it writes into space that daemon lent it (``client/credit.py``): with a warm
    restart the arena under that space lives on and is lent again by the next daemon."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            if os.fstat(fd).st_uid == os.getuid() and os.fstat(fd).st_size >= HEADER_BYTES:
                with mmap.mmap(fd, HEADER_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE) as m:
                    words = memoryview(m).cast("Q")
                    words[H_FLAGS] |= CLOSED
                    words.release()
        finally:
            os.close(fd)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class PublishedIndex:
    """The one writer of a shared lookup index file (owner-only, in /dev/shm next to the arena)."""

    def __init__(self, path: str, expected_keys: int) -> None:
        self.path = path
        close_predecessor(path)   # a killed predecessor's file (the caller holds the daemon lock)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, FILE_BYTES)   # sparse: tmpfs backs only the pages the table touches
            self._buf = mmap.mmap(fd, FILE_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._words = memoryview(self._buf).cast("Q")
        self._native = NativePlace.open(self._buf)   # None: new keys are placed in Python
        self._slot: dict[bytes, int] = {}      # listed key → slot
        self._state: dict[bytes, Listing] = {}   # every published key → its listing (listed in a slot or not)
        self._unlisted: set[bytes] = set()     # published keys no slot could be found for
        self.tombstones = 0
        self.rebuilds = 0
        self.slots = slots_for(expected_keys)
        w = self._words
        w[H_VERSION], w[H_SLOTS], w[H_EPOCH], w[H_FLAGS], w[H_PID] = LAYOUT_VERSION, self.slots, 0, 0, os.getpid()
        self.beat()
        w[H_MAGIC] = MAGIC   # last: a reader that sees the magic sees a complete header

    # -- what the Store calls -----------------------------------------------------------------------------
    def set(self, key: bytes, state: int, host: int | None = None, size: int = 0) -> None:
        """List ``key`` with ``state`` (its fastest tier) and its DRAM copy (``host``: offset, None: none), or
        update them. Called in the same event-loop step as the change, before the space can be reused."""
        listing = _listing(state, host, size)
        if self._update(key, listing):
            if self._crowded(1) and self._grow():
                return   # the rebuild placed it
            self._place(key, listing)

    def set_many(self, items: Sequence[tuple[bytes, int, int | None, int]]) -> None:
        """``set`` of several (key, state, host, size) at once (a put's chunks): the keys new to the table are
        placed in one call of the C placement where it is built (``kvstore/native/place.py``), else one by one."""
        fresh: dict[bytes, Listing] = {}
        for key, state, host, size in items:
            listing = _listing(state, host, size)
            if self._update(key, listing):
                fresh[key] = listing
        if not fresh or (self._crowded(len(fresh)) and self._grow()):
            return   # nothing new, or the rebuild placed them
        if self._native is None:
            for key, listing in fresh.items():
                self._place(key, listing)
            return
        keys = list(fresh)
        slots, reused = self._native.place(keys, list(fresh.values()), self.slots - 1)
        self.tombstones -= reused
        for key, slot in zip(keys, slots):
            if slot >= 0:
                self._slot[key] = slot
            else:
                self._unlisted.add(key)

    def remove(self, key: bytes) -> None:
        if self._state.pop(key, None) is None:
            return
        self._unlisted.discard(key)
        slot = self._slot.pop(key, None)
        if slot is None:
            return
        self._write_state(slot, _GONE)
        self.tombstones += 1
        if not self._unlisted:   # an unlisted key's probe chain must stay non-empty (see index_layout.py)
            self._clear_dead_tombstones(slot)

    # -- daemon lifecycle ---------------------------------------------------------------------------------
    def beat(self) -> None:
        """Tell readers the writer is alive (called from the daemon's sweep)."""
        self._words[H_HEARTBEAT] = time.monotonic_ns()

    def set_flag(self, flag: int, on: bool = True) -> None:
        w = self._words
        w[H_FLAGS] = (w[H_FLAGS] | flag) if on else (w[H_FLAGS] & ~flag)

    def close_to_readers(self) -> None:
        """The daemon is stopping: readers ask the socket from now on (which refuses new work)."""
        self.set_flag(CLOSED)

    def close(self) -> None:
        """Mark the index closed and remove the file (readers that still map it see CLOSED)."""
        self.set_flag(CLOSED)
        if self._native is not None:
            self._native.close()
            self._native = None
        self._words.release()
        self._buf.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    @property
    def listed(self) -> int:
        """How many keys hold a slot."""
        return len(self._slot)

    @property
    def unlisted(self) -> frozenset[bytes]:
        """The published keys no slot could be found for (readers ask the socket for them)."""
        return frozenset(self._unlisted)

    def placement(self) -> dict[bytes, int]:
        """Each listed key's slot (a copy)."""
        return dict(self._slot)

    def table_bytes(self) -> bytes:
        """The slots as readers see them (a copy), to compare two writers' tables."""
        return bytes(self._buf[HEADER_BYTES:HEADER_BYTES + self.slots * SLOT_BYTES])

    @property
    def places_in_c(self) -> bool:
        """Whether new keys are placed in C (False: in Python, the library is not built or ``place_in_python``)."""
        return self._native is not None

    def place_in_python(self) -> None:
        """Place new keys in Python from now on, as a writer without the C library does (to compare the two)."""
        if self._native is not None:
            self._native.close()
            self._native = None

    # -- the table ----------------------------------------------------------------------------------------
    def _update(self, key: bytes, listing: Listing) -> bool:
        """Record ``key``'s listing and rewrite its slot if it has one; True when it must be placed (new to the
        table, and not a key no slot could be found for)."""
        if self._state.get(key) == listing:
            return False
        self._state[key] = listing
        slot = self._slot.get(key)
        if slot is not None:
            self._write_state(slot, listing)
            return False
        return key not in self._unlisted

    def _crowded(self, new_keys: int) -> bool:
        """Whether ``new_keys`` more would take live keys and tombstones past REBUILD_LOAD of the slots."""
        return len(self._slot) + self.tombstones + new_keys > REBUILD_LOAD * self.slots

    def _write_slot(self, slot: int, key: bytes, listing: Listing) -> None:
        w, base = self._words, (HEADER_BYTES // 8) + slot * SLOT_WORDS
        seq = w[base]
        w[base] = seq + 1                                   # odd: readers retry this slot
        w[base + 1] = int.from_bytes(key[:8], "little")
        w[base + 2] = int.from_bytes(key[8:], "little")
        w[base + 3], w[base + 4], w[base + 5] = listing
        w[base] = seq + 2

    def _write_state(self, slot: int, listing: Listing) -> None:
        w, base = self._words, (HEADER_BYTES // 8) + slot * SLOT_WORDS
        seq = w[base]
        w[base] = seq + 1
        w[base + 3], w[base + 4], w[base + 5] = listing
        w[base] = seq + 2

    def _state_at(self, slot: int) -> int:
        return self._words[(HEADER_BYTES // 8) + slot * SLOT_WORDS + 3]

    def _place(self, key: bytes, listing: Listing) -> bool:
        mask = self.slots - 1
        slot = int.from_bytes(key[:8], "little") & mask
        for _ in range(MAX_PROBE):
            here = self._state_at(slot)
            if here in (EMPTY, TOMBSTONE):
                if here == TOMBSTONE:
                    self.tombstones -= 1
                self._write_slot(slot, key, listing)
                self._slot[key] = slot
                return True
            slot = (slot + 1) & mask
        self._unlisted.add(key)
        return False

    def _clear_dead_tombstones(self, slot: int) -> None:
        """Turn tombstones back into EMPTY slots where no probe chain runs through them any more: a run of
        tombstones that ends right before an EMPTY slot."""
        mask = self.slots - 1
        if self._state_at((slot + 1) & mask) != EMPTY:
            return
        while self._state_at(slot) == TOMBSTONE:
            self._write_state(slot, _EMPTY)
            self.tombstones -= 1
            slot = (slot - 1) & mask

    def _grow(self) -> bool:
        """Rebuild the table (bigger when the live keys call for it) under the epoch lock. False when it is at
        its largest and has no tombstones worth clearing: the key is placed (or left unlisted) as usual."""
        live = len(self._state)
        slots = max(self.slots, slots_for(live + 1))
        if slots == self.slots and self.tombstones < self.slots // 8:
            return False
        w = self._words
        w[H_EPOCH] += 1                                     # odd: readers ask the socket until it is even
        start, end = HEADER_BYTES, HEADER_BYTES + max(slots, self.slots) * SLOT_BYTES
        self._buf[start:end] = bytes(end - start)
        self.slots = slots
        w[H_SLOTS] = slots
        self._slot.clear()
        self._unlisted.clear()
        self.tombstones = 0
        for key, listing in self._state.items():
            self._place(key, listing)
        w[H_EPOCH] += 1
        self.rebuilds += 1
        return True

