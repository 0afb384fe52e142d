"""What each tier holds, turned into KV cache events (the Store's event sink; the wire is ``protocol/kv_events.py``).

The Store tells this log of every change to a key (``Store.sync``): the entry as it is now, or None when the key
is not readable any more. The log keeps, per key, the set of media it last published (a 3-bit mask) and
publishes only the difference: a medium gained is a ``BlockStored``, a medium lost a ``BlockRemoved``. Because it
diffs against what it published rather than trusting the caller to say what changed, being told twice, or of a
change that moved nothing a router can see, publishes nothing.

Media (vLLM's vocabulary): the GPU tier is ``GPU`` (the bytes sit in HBM on this host, loaded by a device copy),
DRAM is ``CPU``, a stored disk file is ``STORAGE``. The remote store is not announced: it is shared by many
daemons and evicts on its own, so this daemon cannot say when a chunk leaves it.

Engine names: a chunk put with the engine's block hashes (``Entry.engine``, ``protocol/engine_blocks.py``) is
published as the engine's blocks: its ``BlockStored`` carries the engine's hashes, parent hash, token ids and
block size, its ``BlockRemoved`` the engine's hashes, so a router keys it as it keys the engine's own blocks. A
chunk without them (the transformers connector, the raw client) is one block named by its chunk key.

Groups: a chunk of a namespace whose engine named its KV cache groups at hello (``note_groups``; the vLLM
connector does for hybrid models, whose chunks hold attention KV and recurrent state) is published once per
group, each event with its ``group_idx``, as vLLM publishes its own hybrid blocks: a router that counts a prefix
only where every group holds it sees exactly what a load can use, and since a chunk is one object its groups'
events always come and go together. The groups a chunk is published under are fixed when it is first held, so
a chunk held before its engine's hello (adopted at a restart) is published without them until it leaves.

Cost per change on the event loop: a dict store (the key and its entry are noted); at the end of the turn, once per
key noted, a dict lookup, a few integer operations and, when something changed, the events handed to the
publisher (``server/events/publisher.py``), which never blocks. A chunk's names are packed once, when it is first held
(``Packed``), so that a snapshot is assembled from bytes (``snapshot_packed``).
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Sequence

import msgpack

from ..protocol.kv_events import (
    MEDIUM_CPU, MEDIUM_GPU, MEDIUM_STORAGE, Cleared, Event, Group, PackedRun, Removed, Stored, array_header,
    block_hash, encoded_events, packed_hash, packed_ints, packed_stored,
)
from ..protocol.engine_blocks import EngineBlocks
from .entry import DiskState, Entry, State

GPU, CPU, STORAGE = 1, 2, 4
# a held chunk's names, packed once when it is first held (``packed_ints``), for snapshots: its last block hash,
# how many block hashes, them packed (empty for a chunk named by its key: its one hash is packed by the snapshot),
# how many token ids, them packed
Packed = tuple[int, int, bytes, int, bytes]
# media mask, parent block hash, block size, the engine's names of its blocks (None: named by the chunk key),
# the chunk's namespace, its names packed, the engine's KV cache groups it is published under (none: not said)
Holding = tuple[int, "int | None", int, "EngineBlocks | None", str, Packed, "tuple[Group, ...]"]
# where events go: (events, the namespace they are of; None: of every namespace)
Outbox = Callable[[list[Event], "str | None"], None]
MEDIA = ((GPU, MEDIUM_GPU), (CPU, MEDIUM_CPU), (STORAGE, MEDIUM_STORAGE))
MEDIUM_OF = {bit: medium for bit, medium in MEDIA}   # a mask of one medium: its name
_COMMITTED, _STORED = State.COMMITTED, DiskState.STORED


def media_of(entry: Entry | None) -> int:
    """The mask of media holding a readable copy of ``entry`` (0: none, or not readable)."""
    if entry is None or entry.state is not _COMMITTED or entry.doomed:   # ``Entry.readable``, inlined: per change
        return 0
    return ((GPU if entry.gpu_offset is not None else 0) | (CPU if entry.host_offset is not None else 0)
            | (STORAGE if entry.disk is _STORED else 0))


class EventLog:
    """The media each key was last published in, and the events that move it to the Store's present state.

    With ``schedule`` (the publisher's ``wake``), a change only notes the key and its entry (a dict store): the
    keys noted since the last drain are diffed together when the publisher drains the log (``drain``, at the end
    of a turn of the event loop, before it sends the batch), each key once however often it changed meanwhile.
    Without it (tests, tools), every change is diffed and handed to ``outbox`` at once."""

    def __init__(self, outbox: Outbox, schedule: Callable[[], None] | None = None) -> None:
        self._outbox = outbox
        self._schedule = schedule
        self._waiting = False   # a drain is scheduled
        self._dirty: dict[bytes, Entry | None] = {}   # keys changed since the last drain, with their entry now
        self._held: dict[bytes, Holding] = {}
        self._block_size: dict[str, int] = {}
        self._groups: dict[str, tuple[Group, ...]] = {}
        self._packer = msgpack.Packer()   # on the thread that drains only

    def note_block_size(self, namespace: str, tokens: int) -> None:
        """Chunks of ``namespace`` hold ``tokens`` tokens each (said at hello): their events' ``block_size``."""
        self._block_size[namespace] = tokens

    def note_groups(self, namespace: str, groups: Sequence[tuple[str, int | None]]) -> None:
        """Chunks of ``namespace`` hold these KV cache groups of their engine, each (kv_cache_spec_kind, sliding
        window) (said at hello): chunks first held from now on are published once per group."""
        self._groups[namespace] = tuple((i, kind, window) for i, (kind, window) in enumerate(groups))

    def changed(self, key: bytes, entry: Entry | None) -> None:
        """``key``'s readable entry now (None: not readable): publish what moved."""
        self._dirty[key] = entry
        self._due()

    def changed_many(self, items: Sequence[tuple[bytes, Entry | None]]) -> None:
        """``changed`` of several keys (a put's chain), in one hand-off: a chain entering a tier is one event."""
        self._dirty.update(items)
        self._due()

    def _due(self) -> None:
        if self._schedule is None:
            self.drain()
        elif not self._waiting:
            self._waiting = True
            self._schedule()

    def drain(self) -> None:
        """Diff every key changed since the last drain, in the order first changed, and hand the events over (one
        list per namespace)."""
        self._waiting = False
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, {}
        events: dict[str, list[Event]] = {}
        diff = self._diff
        for key, entry in dirty.items():
            diff(key, entry, events)
        for namespace, of_namespace in events.items():
            if of_namespace:
                self._outbox(of_namespace, namespace)

    def noted(self) -> int:
        """Keys changed since the last drain (not yet turned into events)."""
        return len(self._dirty)

    def all_cleared(self) -> None:
        """Everything published is gone at once (a start, or a clear of all the daemon held): the keys changed
        before it in this turn are diffed after it, against nothing held."""
        self._held.clear()
        self._outbox([Cleared()], None)

    def snapshot(self, namespaces: Collection[str] | None = None) -> list[tuple[bytes, Holding]]:
        """Every key published as held (of ``namespaces`` only, when given), with its media mask, parent hash and
        block size: a copy, cheap enough for the event loop (the events are built from it elsewhere:
        ``snapshot_events``). The caller drains first (the publisher's ``flush``)."""
        if namespaces is None:
            return list(self._held.items())
        return [(key, held) for key, held in self._held.items() if held[4] in namespaces]

    def _diff(self, key: bytes, entry: Entry | None, out: dict[str, list[Event]]) -> None:
        now = media_of(entry)
        held = self._held.get(key)
        before = held[0] if held is not None else 0
        if now == before:
            return
        holding = None
        if now and entry is not None:   # a chunk already held keeps the names it was first published under
            holding = self._held[key] = (now, *held[1:]) if held is not None else self._holding(now, entry)
        else:
            del self._held[key]
        namespace = held[4] if held is not None else entry.namespace if entry is not None else ""
        events = out.get(namespace)
        if events is None:
            events = out[namespace] = []
        gained, lost = now & ~before, before & ~now
        if not lost and gained in MEDIUM_OF and holding is not None:   # the usual: a tier more (often its first)
            _append_stored(events, key, holding, MEDIUM_OF[gained])
        elif not gained and lost in MEDIUM_OF and held is not None:    # or a tier less (often its last)
            _append_removed(events, _hashes_of(key, held), MEDIUM_OF[lost], held[6])
        else:
            for bit, medium in MEDIA:
                if lost & bit and held is not None:   # removed under the names it was stored under
                    _append_removed(events, _hashes_of(key, held), medium, held[6])
                if gained & bit and holding is not None:
                    _append_stored(events, key, holding, medium)

    def _holding(self, mask: int, entry: Entry) -> Holding:
        engine = entry.engine
        if engine is not None:
            hashes, tokens = engine.hashes, engine.token_ids
            packed = (hashes[-1], len(hashes), packed_ints(self._packer, hashes), len(tokens),
                      packed_ints(self._packer, tokens))
            return (mask, engine.parent, engine.block_size, engine, entry.namespace, packed,
                    self._groups.get(entry.namespace, ()))
        parent = block_hash(entry.parent) if entry.parent is not None else None
        h = block_hash(entry.key)
        return (mask, parent, self._block_size.get(entry.namespace, 0), None, entry.namespace, (h, 1, b"", 0, b""),
                self._groups.get(entry.namespace, ()))


def _hashes_of(key: bytes, holding: Holding) -> list[int]:
    """The block hashes a held chunk is published under: the engine's, else its chunk key's."""
    engine = holding[3]
    return list(engine.hashes) if engine is not None else [holding[5][0]]


def _append_stored(events: list[Event], key: bytes, holding: Holding, medium: str) -> None:
    """A ``BlockStored`` (one per group of a chunk published by groups), merged into the one before (that group's
    among the last events) when it continues the same chain in the same tier at the same block size."""
    _, parent, size, engine, _, _, groups = holding
    hashes = _hashes_of(key, holding)
    tokens = list(engine.token_ids) if engine is not None else []
    for group in groups or (None,):
        last = _last_of(events, Stored, group, len(groups))
        if (isinstance(last, Stored) and last.medium == medium and last.hashes[-1] == parent
                and last.block_size == size and bool(last.token_ids) == bool(tokens)):
            last.hashes.extend(hashes)
            last.token_ids.extend(tokens)
            continue
        events.append(Stored(list(hashes), parent, medium, size, list(tokens), group))


def _append_removed(events: list[Event], hashes: list[int], medium: str, groups: tuple[Group, ...] = ()) -> None:
    for group in groups or (None,):
        last = _last_of(events, Removed, group, len(groups))
        if isinstance(last, Removed) and last.medium == medium:
            last.hashes.extend(hashes)
            continue
        events.append(Removed(list(hashes), medium, group))


def _last_of(events: list[Event], kind: type, group: Group | None, groups: int) -> Event | None:
    """The event a new one of ``group`` may merge into: the last event (without groups), else that group's among
    the last ``groups`` events, when they are all of ``kind``."""
    if group is None:
        return events[-1] if events else None
    for event in events[-1:-groups - 1:-1]:
        if not isinstance(event, kind) or isinstance(event, Cleared):
            return None
        if event.group == group:
            return event
    return None


def snapshot_events(rows: list[tuple[bytes, Holding]]) -> list[Event]:
    """What a consumer that knows nothing must apply to hold what ``rows`` (``EventLog.snapshot``) say:
    ``AllBlocksCleared``, then per medium a ``BlockStored`` per run of chained chunks, in the order they were
    announced (a chunk's parent before it, as it was published)."""
    events: list[Event] = [Cleared()]
    for bit, medium in MEDIA:
        run: list[Event] = []   # this medium's events: a run is merged only within them
        for key, holding in rows:
            if holding[0] & bit:
                _append_stored(run, key, holding, medium)
        events.extend(run)
    return events


def snapshot_packed(rows: list[tuple[bytes, Holding]], fmt: str, incarnation: str, packer: Any) -> tuple[int, bytes]:
    """``snapshot_events(rows)`` packed as a batch's events element (``fmt``, ``incarnation`` as the publisher's),
    and how many events it holds: assembled from the names each chunk keeps packed, so that no integer is packed
    again (a snapshot of a million engine blocks and their token ids is mostly copying bytes)."""
    if any(holding[6] for _, holding in rows):   # chunks published by groups (hybrid models): event by event
        events = encoded_events(snapshot_events(rows), fmt, incarnation)
        return len(events), array_header(len(events)) + b"".join(packer.pack(e) for e in events)
    parts = [packer.pack(encoded_events([Cleared()], fmt, incarnation)[0])]
    for bit, medium in MEDIA:
        run: PackedRun | None = None
        last = -1
        for _, holding in rows:
            if not holding[0] & bit:
                continue
            _, parent, size, _, _, (tail, n_hashes, hashes, n_tokens, tokens), _ = holding
            hashes = hashes or packed_hash(tail)   # a chunk named by its key packs its one hash only here
            if (run is not None and last == parent and run.block_size == size
                    and bool(run.n_tokens) == bool(n_tokens)):
                run.hashes.append(hashes)
                run.tokens.append(tokens)
                run.n_hashes += n_hashes
                run.n_tokens += n_tokens
            else:
                if run is not None:
                    parts.append(packed_stored(packer, run, medium, fmt, incarnation))
                run = PackedRun([hashes], n_hashes, parent, size, [tokens], n_tokens)
            last = tail
        if run is not None:
            parts.append(packed_stored(packer, run, medium, fmt, incarnation))
    return len(parts), array_header(len(parts)) + b"".join(parts)
