"""What happens to a damaged copy: ``Damage``, the collaborator the Store owns for it (``Store.damage``).

A damaged copy in a lower tier is dropped through that tier's ledger (``DiskLedger.rewrite`` / ``drop_copy``,
``GpuLedger.free``): the ledgers stay the only code that changes their tiers' fields.

Every chunk carries one checksum (xxh3-64 of its bytes as committed, ``Entry.checksum``) in every tier. Who
computes and checks it is ``integrity.py``; what happens to a copy that fails is decided here, on the event
loop, by the only code that frees slots:

* **A damaged copy with an intact one elsewhere is repaired**: the bad copy goes and the chunk stays readable
  from the good one. A disk file is written only after its DRAM slot matched the checksum, and a GPU copy is made
  only from a slot that matched, so those copies are trusted when DRAM fails; a damaged file of a chunk still in
  DRAM is quarantined and written again from DRAM (after the same check).
* **Otherwise the chunk is dropped with its continuations**: a lookup walks a chain from its first chunk and
  stops at the first miss, so chunks past a dropped one are unreachable until it is stored again; they go at
  once rather than waiting to be evicted. A chunk that is leased while found damaged is dropped too (its reader
  may be using the slot; the slot is freed when the lease ends).

Finding continuations costs one pass over the index (children are not indexed: a chunk knows its parent only).
Damage is rare and a scrub pass is O(index) anyway, so this keeps every put free of the extra bookkeeping.

Checks that read a host slot off the event loop hold it with ``begin_check`` / ``end_check`` (``Entry.checking``):
while a check reads it, the slot is neither evicted nor demoted nor freed by a delete, as for a disk write.

``Damage`` owns the damage counters (``IntegrityCounters``) and is given only what it uses: the index and the
DRAM queue (``DamageStore``, which the Store fits) and the disk and GPU ledgers it repairs through. Each operation
returns how many chunks it dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Protocol, Sequence

from .entry import DiskState, Entry, State

if TYPE_CHECKING:
    from .ledgers.disk import DiskLedger
    from .ledgers.gpu import GpuLedger
    from .eviction import EvictionQueue


TIERS = ("host", "disk", "gpu", "remote")


@dataclass
class IntegrityCounters:
    """Damage found in each tier (by any check: commit, moves, gets, scrubs), and what was done about it."""

    corrupt_host: int = 0
    corrupt_disk: int = 0
    corrupt_gpu: int = 0
    corrupt_remote: int = 0
    repaired: int = 0            # bad copies replaced by (or served from) an intact copy in another tier
    dropped: int = 0             # chunks removed from the index because of damage (continuations included)
    sums: int = 0                # checksums computed at commit
    sum_bytes: int = 0


class DamageStore(Protocol):
    """What the damage path uses of the Store: the index, the DRAM queue, and the ways a chunk lets go."""

    @property
    def index(self) -> dict[bytes, Entry]: ...
    @property
    def lru(self) -> EvictionQueue: ...

    def release_if_idle(self, entry: Entry) -> None: ...
    def free_host(self, entry: Entry) -> None: ...
    def remove_committed(self, entry: Entry) -> None: ...


class Damage:
    """Checks in progress and damaged copies (see the module docstring)."""

    def __init__(self, store: DamageStore, disk_ledger: "DiskLedger | None", gpu_ledger: "GpuLedger | None") -> None:
        """The damage path of ``store``, repairing lower-tier copies through ``disk_ledger`` and ``gpu_ledger``."""
        self.store = store
        self.disk_ledger = disk_ledger
        self.gpu_ledger = gpu_ledger
        self.counters = IntegrityCounters()

    def begin_check(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            entry.checking += 1

    def end_check(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            entry.checking -= 1
            assert entry.checking >= 0, "ended more checks than begun"
            if entry.doomed:
                self.store.release_if_idle(entry)

    def damaged(self, entry: Entry, tier: str) -> int:
        """``entry``'s copy in ``tier`` failed its checksum: repair from another copy or drop the chunk and its
        continuations. Returns the chunks dropped from the index (0 when repaired or already gone)."""
        if self.store.index.get(entry.key) is not entry or not entry.readable:
            return 0   # gone meanwhile: nothing is counted for a copy that is no longer ours
        c = self.counters
        setattr(c, f"corrupt_{tier}", getattr(c, f"corrupt_{tier}") + 1)
        if self._repair(entry, tier):
            c.repaired += 1
            return 0
        return self.drop_chain(entry, quarantine=f"{tier} copy failed its checksum" if tier == "disk" else None)

    def _repair(self, entry: Entry, tier: str) -> bool:
        if entry.pins or entry.loading is not None or entry.gpu_loading is not None:
            return False
        if tier == "host" and entry.host_offset is not None and entry.checking == 0 \
                and entry.disk is not DiskState.WRITING \
                and (entry.disk is DiskState.STORED or entry.gpu_offset is not None):
            self.store.lru.remove(entry)
            if entry.disk is not DiskState.STORED and self.disk_ledger is not None:
                self.disk_ledger.forget(entry)   # a queued write would copy the bad slot
            self.store.free_host(entry)
            return True
        if tier == "disk" and entry.disk is DiskState.STORED and entry.host_offset is not None:
            assert self.disk_ledger is not None   # a stored file implies the disk tier
            self.disk_ledger.rewrite(entry)   # written again from DRAM, after its own check
            return True
        if tier == "gpu" and entry.gpu_offset is not None \
                and (entry.host_offset is not None or entry.disk is DiskState.STORED):
            assert self.gpu_ledger is not None   # a GPU copy implies the GPU tier
            self.gpu_ledger.free(entry)
            return True
        return False

    def drop_chain(self, entry: Entry, quarantine: str | None = None) -> int:
        """Remove ``entry`` and every chunk that continues it, from every tier. Returns how many."""
        doomed = [entry] + self.continuations(entry.key)
        if quarantine is not None and self.disk_ledger is not None:
            self.disk_ledger.drop_copy(entry, quarantine)
        dropped = 0
        for chunk in doomed:
            if self.store.index.get(chunk.key) is chunk and chunk.state is State.COMMITTED:
                self.store.remove_committed(chunk)
                dropped += 1
        self.counters.dropped += dropped
        return dropped

    def drop_keys(self, keys: Sequence[bytes]) -> int:
        """Drop the chunks ``keys`` name (and their continuations); a verify mismatch."""
        dropped = 0
        for key in keys:
            entry = self.store.index.get(key)
            if entry is not None and entry.readable:
                dropped += self.drop_chain(entry)
        return dropped

    def drop_continuations(self, keys: set[bytes]) -> int:
        """Drop every committed chunk whose chain passes through one of ``keys`` (which need not be indexed: a
        link that never made it into the index). One pass over the index. Returns how many."""
        if not keys:
            return 0
        children = self._children()
        dropped, frontier = 0, list(keys)
        while frontier:
            for child in children.get(frontier.pop(), ()):
                frontier.append(child.key)
                if self.store.index.get(child.key) is child and child.state is State.COMMITTED:
                    self.store.remove_committed(child)
                    dropped += 1
        self.counters.dropped += dropped
        return dropped

    def continuations(self, key: bytes) -> list[Entry]:
        """Every indexed chunk whose chain passes through ``key`` (one pass over the index)."""
        children = self._children()
        found: list[Entry] = []
        frontier = [key]
        while frontier:
            for child in children.get(frontier.pop(), ()):
                found.append(child)
                frontier.append(child.key)
        return found

    def _children(self) -> dict[bytes, list[Entry]]:
        """Each indexed parent key's children (one pass over the index: a chunk knows only its parent)."""
        children: dict[bytes, list[Entry]] = {}
        for entry in self.store.index.values():
            if entry.parent is not None:
                children.setdefault(entry.parent, []).append(entry)
        return children
