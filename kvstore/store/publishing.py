"""What the fleet sees of the Store: ``Publishing``, the collaborator the Store owns for it (``Store.publishing``).

Every change to what a tier holds is told to two listeners, each optional: the shared lookup index local clients
read (``published``, ``mapped/index_writer.py``) and the KV cache event sink (``events``, ``store/events.py``).
``sync`` publishes one key's state as the index holds it *now* (its fastest tier, or gone), so callers call it
after every change and never say what changed; ``sync_many`` does a put's keys in one batch. A restricted
tenant's namespaces (``private``) are kept out of the shared index, which any local reader could map; events
still name them.

``Publishing`` owns the two listeners and the private test, and is given only the Store's index, which it reads
and never changes. Cost: a dict lookup and one or two listener calls per key.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..protocol.index_layout import STATE_OF_TIER
from .entry import Entry
from .sinks import EventSink, IndexSink


class Publishing:
    """The shared index and event sink of one Store (see the module docstring)."""

    def __init__(self, index: dict[bytes, Entry], private: Callable[[str], bool] | None = None,
                 events: EventSink | None = None, published: IndexSink | None = None) -> None:
        """Publish the chunks of ``index`` (the Store's, read only).

        Args:
            private: whether a namespace is kept out of the shared index (a restricted tenant's).
            events: the KV cache event sink, when the daemon publishes events.
            published: the shared lookup index, when the daemon publishes one.
        """
        self.index = index
        self.private = private
        self.events = events
        self.published = published   # None once the index closes (``server/lifecycle/local_access.py``)

    def stop_publishing(self) -> None:
        """Feed the shared lookup index no more (it is about to close)."""
        self.published = None

    def set_private(self, private: Callable[[str], bool] | None) -> None:
        """Which namespaces are kept out of the shared index from now on (a reload's new table): every chunk of a
        namespace that became private leaves the index at once, every chunk of one that became open is listed."""
        self.private = private
        if self.published is None:
            return
        listed = []
        for key, entry in self.index.items():
            if entry.readable and not self._private(entry):
                listed.append((key, STATE_OF_TIER[top_tier(entry)], entry.host_offset, entry.size))
            else:
                self.published.remove(key)
        self.published.set_many(listed)

    def sync(self, key: bytes) -> None:
        """Publish ``key``'s readable state as it is now (called after every change to it): its fastest tier, or
        gone. Read from the index rather than from a changed entry, since a doomed entry freed late must not
        unlist the new chunk stored under its key since."""
        entry = self.index.get(key)
        readable = entry if entry is not None and entry.readable else None
        if self.events is not None:
            self.events.changed(key, readable)
        if self.published is None:
            return
        if readable is not None and not self._private(readable):
            self.published.set(key, STATE_OF_TIER[top_tier(readable)], readable.host_offset, readable.size)
        else:
            self.published.remove(key)

    def sync_many(self, keys: Sequence[bytes]) -> None:
        """``sync`` of several keys (a put's chunks), published in one batch."""
        if self.events is not None:
            self.events.changed_many([(k, self.index.get(k)) for k in keys])
        if self.published is None:
            return
        listed = []
        for key in keys:
            entry = self.index.get(key)
            if entry is not None and entry.readable and not self._private(entry):
                listed.append((key, STATE_OF_TIER[top_tier(entry)], entry.host_offset, entry.size))
            else:
                self.published.remove(key)
        self.published.set_many(listed)

    def all_cleared(self) -> None:
        """Every chunk the Store held was deleted at once: the event sink hears of one clear."""
        if self.events is not None:
            self.events.all_cleared()

    def _private(self, entry: Entry) -> bool:
        return self.private is not None and self.private(entry.namespace)


def top_tier(entry: Entry) -> str:
    """The fastest tier that holds the chunk."""
    if entry.gpu_offset is not None:
        return "gpu"
    return "host" if entry.host_offset is not None else "disk"
