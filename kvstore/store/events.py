"""What each tier holds, turned into KV cache events (the Store's event sink; the wire is ``protocol/kv_events.py``).

The Store tells this log of every change to a key (``Store.sync``): the entry as it is now, or None when the key
is not readable any more. The log keeps, per key, the set of media it last published (a 3-bit mask) and
publishes only the difference: a medium gained is a ``BlockStored``, a medium lost a ``BlockRemoved``. Because it
diffs against what it published rather than trusting the caller to say what changed, being told twice, or of a
change that moved nothing a router can see, publishes nothing.

Media (vLLM's vocabulary): the GPU tier is ``GPU`` (the bytes sit in HBM on this host, loaded by a device copy),
DRAM is ``CPU``, a stored disk file is ``STORAGE``. The remote store is not announced: it is shared by many
daemons and evicts on its own, so this daemon cannot say when a chunk leaves it.

Cost per change on the event loop: a dict lookup, a few integer operations and, when something changed, one
small record handed to the publisher's queue (``server/kv_events.py``), which never blocks.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..protocol.kv_events import (
    MEDIUM_CPU, MEDIUM_GPU, MEDIUM_STORAGE, Cleared, Event, Removed, Stored, block_hash,
)
from .entry import DiskState, Entry

GPU, CPU, STORAGE = 1, 2, 4
Holding = tuple[int, "int | None", int]   # media mask, parent block hash, block size
MEDIA = ((GPU, MEDIUM_GPU), (CPU, MEDIUM_CPU), (STORAGE, MEDIUM_STORAGE))


def media_of(entry: Entry | None) -> int:
    """The mask of media holding a readable copy of ``entry`` (0: none, or not readable)."""
    if entry is None or not entry.readable:
        return 0
    mask = GPU if entry.gpu_offset is not None else 0
    if entry.host_offset is not None:
        mask |= CPU
    if entry.disk is DiskState.STORED:
        mask |= STORAGE
    return mask


class EventLog:
    """The media each key was last published in, and the events that move it to the Store's present state."""

    def __init__(self, outbox: Callable[[list[Event]], None]) -> None:
        self._outbox = outbox
        self._held: dict[bytes, Holding] = {}
        self._block_size: dict[str, int] = {}

    def note_block_size(self, namespace: str, tokens: int) -> None:
        """Chunks of ``namespace`` hold ``tokens`` tokens each (said at hello): their events' ``block_size``."""
        self._block_size[namespace] = tokens

    def changed(self, key: bytes, entry: Entry | None) -> None:
        """``key``'s readable entry now (None: not readable): publish what moved."""
        events: list[Event] = []
        self._diff(key, entry, events)
        if events:
            self._outbox(events)

    def changed_many(self, items: Sequence[tuple[bytes, Entry | None]]) -> None:
        """``changed`` of several keys (a put's chain), in one hand-off: a chain entering a tier is one event."""
        events: list[Event] = []
        for key, entry in items:
            self._diff(key, entry, events)
        if events:
            self._outbox(events)

    def all_cleared(self) -> None:
        """Everything published is gone at once (a start, or a clear of all the daemon held)."""
        self._held.clear()
        self._outbox([Cleared()])

    def snapshot(self) -> list[tuple[bytes, Holding]]:
        """Every key published as held, with its media mask, parent hash and block size: a copy, cheap enough
        for the event loop (the events are built from it elsewhere: ``snapshot_events``)."""
        return list(self._held.items())

    def _diff(self, key: bytes, entry: Entry | None, events: list[Event]) -> None:
        now = media_of(entry)
        held = self._held.get(key)
        before = held[0] if held is not None else 0
        if now == before:
            return
        if now and entry is not None:
            parent = block_hash(entry.parent) if entry.parent is not None else None
            self._held[key] = (now, parent, self._block_size.get(entry.namespace, 0))
        else:
            del self._held[key]
        gained, lost = now & ~before, before & ~now
        for bit, medium in MEDIA:
            if lost & bit:
                _append_removed(events, block_hash(key), medium)
            if gained & bit and entry is not None:
                self._append_stored(events, entry, medium)

    def _append_stored(self, events: list[Event], entry: Entry, medium: str) -> None:
        """A ``BlockStored``, merged into the previous event when it continues the same chain in the same tier."""
        h = block_hash(entry.key)
        parent = block_hash(entry.parent) if entry.parent is not None else None
        last = events[-1] if events else None
        if isinstance(last, Stored) and last.medium == medium and last.hashes[-1] == parent:
            last.hashes.append(h)
            return
        events.append(Stored([h], parent, medium, self._block_size.get(entry.namespace, 0)))


def _append_removed(events: list[Event], h: int, medium: str) -> None:
    last = events[-1] if events else None
    if isinstance(last, Removed) and last.medium == medium:
        last.hashes.append(h)
        return
    events.append(Removed([h], medium))


def snapshot_events(rows: list[tuple[bytes, Holding]]) -> list[Event]:
    """What a consumer that knows nothing must apply to hold what ``rows`` (``EventLog.snapshot``) say:
    ``AllBlocksCleared``, then per medium a ``BlockStored`` per run of chained chunks, in the order they were
    announced (a chunk's parent before it, as it was published)."""
    events: list[Event] = [Cleared()]
    for bit, medium in MEDIA:
        last: Stored | None = None
        for key, (mask, parent, size) in rows:
            if not mask & bit:
                continue
            h = block_hash(key)
            if last is not None and last.hashes[-1] == parent and last.block_size == size:
                last.hashes.append(h)
                continue
            last = Stored([h], parent, medium, size)
            events.append(last)
    return events
