"""S3-FIFO eviction order: a small probationary FIFO, a main FIFO with reinsertion, and a ghost of keys.

The algorithm (Yang et al., SOSP'23). New chunks enter the *small* queue. A touch only bumps a 2-bit
frequency; nothing moves on a hit, which is why every operation stays O(1). To find a victim: while the small
queue holds more than its share (10 %) of the chunks, its oldest chunk is examined — if it was touched since it
came in it moves to the main queue, else it is the victim and its key goes to the *ghost*. Otherwise the main
queue's oldest chunk is examined — if touched it goes back to the new end with its frequency decremented, else
it is the victim. A chunk whose key is in the ghost skips probation and enters the main queue. One-hit chunks
thus leave after a short stay, while chunks read twice compete in the larger main queue.

Chains. Chunks are added deepest first (as in ``eviction.LruQueue``), so within each FIFO a continuation is older
than its prefix and goes first; a touch bumps every chunk of the chain alike.

Pins. The Store takes a pinned chunk out of the queue and puts it back when the lease ends; a queue cannot tell
that from a chunk leaving for good. So a removed chunk's key goes to the ghost with its frequency, and when it
comes back it enters the main queue with that frequency: a chunk that was read is treated as a re-reference.
The ghost holds at most as many keys as the queue holds chunks (at least ``GHOST_MIN``), oldest dropped first.

A victim the Store cannot take yet (a chunk being written) is pushed back at the old end of the main queue.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Iterator

from .entry import Entry

SMALL_SHARE = 0.10
MAX_FREQ = 3
GHOST_MIN = 64


class S3FifoQueue:
    def __init__(self, small_share: float = SMALL_SHARE) -> None:
        self.small_share = small_share
        self._small: OrderedDict[bytes, Entry] = OrderedDict()   # oldest first
        self._main: OrderedDict[bytes, Entry] = OrderedDict()
        self._freq: dict[bytes, int] = {}                        # chunks in either queue
        self._ghost: OrderedDict[bytes, int] = OrderedDict()     # key → frequency when it left

    def __len__(self) -> int:
        return len(self._small) + len(self._main)

    def __contains__(self, entry: Entry) -> bool:
        return entry.key in self._freq

    def __iter__(self) -> Iterator[Entry]:
        """Small queue first, then main, each oldest first (close to, not exactly, the eviction order)."""
        return iter(list(self._small.values()) + list(self._main.values()))

    def add_chain(self, chain: Iterable[Entry]) -> None:
        for entry in reversed(list(chain)):
            self._insert(entry)

    def touch_chain(self, chain: Iterable[Entry]) -> None:
        freq = self._freq
        for entry in chain:
            f = freq.get(entry.key)
            if f is not None and f < MAX_FREQ:
                freq[entry.key] = f + 1

    def remove(self, entry: Entry) -> None:
        key = entry.key
        if (self._small.get(key) or self._main.get(key)) is not entry:
            return   # not queued, or a newer chunk stored under the key since
        f = self._freq.pop(key)
        if self._small.pop(key, None) is None:
            del self._main[key]
        self._remember(key, f)

    def add_newest(self, entry: Entry) -> None:
        self._insert(entry)

    def push_oldest(self, entries: list[Entry]) -> None:
        for entry in reversed(entries):
            if entry.key not in self._freq:
                self._freq[entry.key] = self._ghost.pop(entry.key, 0)
                self._main[entry.key] = entry
                self._main.move_to_end(entry.key, last=False)

    def peek_oldest(self) -> Entry | None:
        queue = self._settle()
        return None if queue is None else next(iter(queue.values()))

    def pop_oldest(self) -> Entry | None:
        queue = self._settle()
        if queue is None:
            return None
        key, entry = queue.popitem(last=False)
        del self._freq[key]
        if queue is self._small:
            self._remember(key, 0)
        return entry

    # -- internals ------------------------------------------------------------------------------------------
    def _insert(self, entry: Entry) -> None:
        key = entry.key
        if key in self._freq:
            self.touch_chain((entry,))
            return
        remembered = self._ghost.pop(key, None)
        if remembered is None:
            self._freq[key] = 0
            self._small[key] = entry
        else:
            self._freq[key] = remembered
            self._main[key] = entry

    def _remember(self, key: bytes, freq: int) -> None:
        ghost = self._ghost
        ghost[key] = freq
        ghost.move_to_end(key)
        limit = max(GHOST_MIN, len(self))
        while len(ghost) > limit:
            ghost.popitem(last=False)

    def _settle(self) -> OrderedDict[bytes, Entry] | None:
        """Move touched chunks on until the queue to evict from has an untouched oldest chunk; return it."""
        small, main, freq = self._small, self._main, self._freq
        while True:
            if small and (not main or len(small) > self.small_share * len(self)):
                key = next(iter(small))
                if not freq[key]:
                    return small
                main[key] = small.pop(key)
                freq[key] = 0
            elif main:
                key = next(iter(main))
                f = freq[key]
                if not f:
                    return main
                freq[key] = f - 1
                main.move_to_end(key)
            else:
                return None
