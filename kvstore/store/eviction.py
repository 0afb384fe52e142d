"""Eviction order: least recently used first, continuations before the prefixes they hang from.

Every eviction queue (this one, ``PrefixFirstLruQueue`` below, ``s3fifo.S3FifoQueue``) has the interface of
``EvictionQueue``; ``policies.py`` names them for the ``eviction_policy`` setting.

The queue holds exactly the chunks that may be evicted now (committed, unpinned); pinning removes a chunk and
unpinning puts it back, so choosing a victim is one pop, never a scan. It is an ``OrderedDict`` rather than a
heap of timestamps because every operation — touch, remove from the middle, pop the oldest — is O(1) on it.

A prefix chunk is useless once its parent is gone, so a continuation must go before its prefix. Requests always
touch a whole chain (lookup walks it, put and get carry it), so touching the chain *deepest first* leaves every
prefix more recent than its continuations: the LRU order alone evicts the deepest, oldest chunks first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Iterator, Protocol

from .entry import Entry


class EvictionQueue(Protocol):
    """What the Store asks of an eviction order. It holds exactly the chunks that may be evicted now."""

    def __len__(self) -> int: ...

    def __contains__(self, entry: Entry) -> bool: ...

    def __iter__(self) -> Iterator[Entry]: ...

    def add_chain(self, chain: Iterable[Entry]) -> None: ...

    def touch_chain(self, chain: Iterable[Entry]) -> None: ...

    def remove(self, entry: Entry) -> None: ...

    def add_newest(self, entry: Entry) -> None: ...

    def push_oldest(self, entries: list[Entry]) -> None: ...

    def peek_oldest(self) -> Entry | None: ...

    def pop_oldest(self) -> Entry | None: ...


class LruQueue:
    def __init__(self) -> None:
        self._order: OrderedDict[bytes, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, entry: Entry) -> bool:
        return entry.key in self._order

    def __iter__(self) -> Iterator[Entry]:
        """Oldest first."""
        return iter(list(self._order.values()))

    def add_chain(self, chain: Iterable[Entry]) -> None:
        """Mark a chain (given prefix first) most recently used, deepest first so that prefixes end newest."""
        for entry in reversed(list(chain)):
            self._order[entry.key] = entry
            self._order.move_to_end(entry.key)

    def touch_chain(self, chain: Iterable[Entry]) -> None:
        """Like add_chain, but only for the chunks already in the queue (pinned ones stay out)."""
        for entry in reversed(list(chain)):
            if entry.key in self._order:
                self._order.move_to_end(entry.key)

    def remove(self, entry: Entry) -> None:
        if self._order.get(entry.key) is entry:   # not a newer chunk stored under the key since
            del self._order[entry.key]

    def add_newest(self, entry: Entry) -> None:
        self._order[entry.key] = entry
        self._order.move_to_end(entry.key)

    def push_oldest(self, entries: list[Entry]) -> None:
        """Put entries back at the old end, in the given order (oldest first); used to restore skipped victims."""
        for entry in reversed(entries):
            self._order[entry.key] = entry
            self._order.move_to_end(entry.key, last=False)

    def peek_oldest(self) -> Entry | None:
        return next(iter(self._order.values()), None)

    def pop_oldest(self) -> Entry | None:
        if not self._order:
            return None
        return self._order.popitem(last=False)[1]


class PrefixFirstLruQueue(LruQueue):
    """Plain LRU for comparison: chains are touched prefix first, so a prefix is older than its continuations
    and goes first, leaving them unreachable until they age out too."""

    def add_chain(self, chain: Iterable[Entry]) -> None:
        for entry in chain:
            self._order[entry.key] = entry
            self._order.move_to_end(entry.key)

    def touch_chain(self, chain: Iterable[Entry]) -> None:
        for entry in chain:
            if entry.key in self._order:
                self._order.move_to_end(entry.key)
