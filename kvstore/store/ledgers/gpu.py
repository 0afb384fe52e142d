"""The GPU tier's ledger: the only code that changes ``Entry.gpu_offset``, ``Entry.gpu_loading`` and ``Entry.hits``,
and keeps the GPU LRU and the promotion requests (``wanted``).

Its mover (``mover.py``; ``sim/movers.py`` in the simulator) runs the copies between ``start_promote`` /
``finish_promote`` and ``start_demote`` / ``finish_demote``. The ledger records intents: the second get that finds
a chunk in DRAM asks for its promotion (``on_hit``) and wakes the mover; ``promotions`` hands the mover a batch of
them and ``shed`` runs the watermark round with the mover's demotion. GPU slots are allocated and freed only here.
A copy down fills a DRAM slot through ``Store.fill_host`` and queues the chunk for the disk through the disk
ledger (it lost its queued write when its DRAM copy went).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from ...errors import StoreFullError
from ..entry import DiskState, Entry
from .base import FillStore, Mover, TierLedger
from ..policies import make_queue
from ..room import make_room, shed_to_low

if TYPE_CHECKING:
    from .disk import DiskLedger

GPU_HIGH_WATERMARK = 0.95
GPU_LOW_WATERMARK = 0.85
GPU_PROMOTE_HITS = 2    # the second get that finds a chunk in DRAM asks for its promotion


class GpuLedger(TierLedger):
    name = "gpu"

    def __init__(self, store: FillStore, gpu: Any, policy: str, disk: DiskLedger | None = None) -> None:
        """The books of ``gpu`` for ``store`` (which builds this ledger: ``builder.py``), its copies evicted in the
        order of ``policy`` (``store/policies.py``); ``disk``: the disk tier's ledger, where a chunk copied down is
        queued for its write."""
        self.store = store
        self.disk = disk
        self.gpu = gpu                            # tier.GpuTier, or an allocator in tests and the simulator
        self.lru = make_queue(policy)
        self.wanted: dict[bytes, Entry] = {}      # promotion requests, oldest first (taken by the mover)
        self.mover: Mover | None = None
        self.budgets_changed()

    def budgets_changed(self) -> None:
        self.lru = self.store.budgets.queue("gpu")

    # -- hooks (ledger.py) -------------------------------------------------------------------------------------
    def on_touch(self, entries: Sequence[Entry]) -> None:
        self.lru.touch_chain(entries)

    def on_hit(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            if entry.gpu_offset is not None:
                continue
            entry.hits += 1
            if entry.hits >= GPU_PROMOTE_HITS and entry.gpu_loading is None:
                self.wanted[entry.key] = entry
        if self.wanted and self.mover is not None:
            self.mover.wake()

    def on_pin(self, entry: Entry) -> None:
        self.lru.remove(entry)

    def on_unpin(self, entries: Sequence[Entry]) -> None:
        back = [e for e in entries if e.gpu_offset is not None]
        self.lru.add_chain(back)
        if back and self.mover is not None and self.over_high():
            self.mover.wake()   # a round that found only leased chunks to demote can go on now

    def uses_dram(self, entry: Entry) -> bool:
        return entry.gpu_loading is not None

    def keeps(self, entry: Entry) -> bool:
        return entry.gpu_offset is not None

    def on_remove(self, entry: Entry) -> None:
        self.wanted.pop(entry.key, None)
        self.lru.remove(entry)   # a chunk deleted while busy keeps its GPU slot until freed, but is never demoted

    def on_free(self, entry: Entry) -> None:
        self.free(entry)

    # -- reads ---------------------------------------------------------------------------------------------------
    def only_here(self, keys: Sequence[bytes]) -> list[Entry]:
        """The chunks of the longest stored prefix of ``keys`` that only the GPU tier holds in memory: what a
        reader without the GPU mapping needs copied down before it can read them."""
        return [e for e in self.store.leading(keys) if e.host_offset is None and e.gpu_offset is not None]

    # -- promotion -------------------------------------------------------------------------------------------------
    def promotions(self, limit: int) -> list[Entry]:
        """Up to ``limit`` of the oldest promotion requests, taken off the list."""
        batch: list[Entry] = []
        while self.wanted and len(batch) < limit:
            batch.append(self.wanted.pop(next(iter(self.wanted))))
        return batch

    def start_promote(self, entry: Entry) -> int | None:
        """Give a DRAM chunk a GPU slot to be copied into; None if it is not promotable or no slot frees up."""
        if not entry.readable or self.store.index.get(entry.key) is not entry \
                or entry.host_offset is None or entry.gpu_offset is not None or entry.gpu_loading is not None:
            return None
        offset = self._allocate(entry)
        if offset is not None:
            entry.gpu_loading = offset
            self.store.budgets.guards["gpu"].charge(entry, entry.size)   # its tenant's from the copy's start
        return offset

    def finish_promote(self, entry: Entry, ok: bool) -> bool:
        """The copy into the GPU slot ended: publish the slot (or give it back on failure or delete)."""
        offset, entry.gpu_loading = entry.gpu_loading, None
        if not ok or entry.doomed:
            self.gpu.free(offset)
            self.store.budgets.guards["gpu"].charge(entry, -entry.size)
            if entry.doomed:
                self.store.release_if_idle(entry)
            return False
        entry.gpu_offset = offset
        self.store.sync(entry.key)
        if entry.pins == 0:
            self.lru.add_chain([entry])
        self.store.tier_counters.promotions_host_gpu += 1
        self.store.tier_counters.promoted_bytes_host_gpu += entry.size
        return True

    # -- demotion ----------------------------------------------------------------------------------------------------
    def over_high(self, leaving: int = 0) -> bool:
        return self.gpu.used_bytes - leaving > GPU_HIGH_WATERMARK * self.gpu.capacity_bytes

    def over_low(self, leaving: int = 0) -> bool:
        return self.gpu.used_bytes - leaving > GPU_LOW_WATERMARK * self.gpu.capacity_bytes

    def shed(self, demote: Callable[[Entry], bool], leaving: Callable[[], int] = lambda: 0) -> int:
        """The watermark round: above the high watermark, ``demote`` the least recently used unleased chunks
        until under the low one (``leaving``: bytes already being copied down, as good as gone)."""
        return shed_to_low(lambda: self.over_high(leaving()), lambda: self.over_low(leaving()), self.victim, demote)

    def victim(self) -> Entry | None:
        """The GPU chunk to demote next: the least recently used one that is not leased."""
        return self.lru.peek_oldest()

    def start_demote(self, entry: Entry, to_host: bool = False) -> int | None:
        """Move a chunk out of the GPU tier. Free at once when a DRAM copy exists, or a disk copy and
        ``to_host`` is false (returns None); otherwise returns the host slot the GPU slot must be copied into
        before ``finish_demote``. Raises StoreFullError when DRAM has no room for it."""
        self.lru.remove(entry)
        if entry.host_offset is not None or (entry.disk is DiskState.STORED and not to_host):
            to_host = entry.host_offset is not None
            self.free(entry)
            self._count_demotion(entry, "host" if to_host else "disk")
            return None
        try:
            entry.loading = self.store.allocate_host(entry.size, namespace=entry.namespace)
        except StoreFullError:
            if entry.pins == 0:
                self.lru.push_oldest([entry])
            raise
        return entry.loading

    def finish_demote(self, entry: Entry, ok: bool) -> None:
        """The copy down ended: the chunk lives in DRAM (and its GPU slot goes, unless it was leased meanwhile)."""
        offset, entry.loading = entry.loading, None
        if not ok or entry.doomed:
            self.store.host.free(offset)
            if entry.doomed:
                self.store.release_if_idle(entry)
            elif entry.pins == 0:
                self.lru.push_oldest([entry])
            return
        self.store.fill_host(entry, offset, evictable=entry.pins == 0)
        self.store.tier_counters.gpu_copies_down += 1
        if entry.pins == 0:
            self.free(entry)
            self._count_demotion(entry, "host")
        if self.disk is not None and entry.disk is DiskState.NONE:
            self.disk.queue_writes([entry])   # it lost its queued write when it left DRAM for the GPU tier

    def _count_demotion(self, entry: Entry, to: str) -> None:
        tc = self.store.tier_counters
        setattr(tc, f"demotions_gpu_{to}", getattr(tc, f"demotions_gpu_{to}") + 1)
        setattr(tc, f"demoted_bytes_gpu_{to}", getattr(tc, f"demoted_bytes_gpu_{to}") + entry.size)

    def _allocate(self, entry: Entry) -> int | None:
        """A GPU slot for ``entry``, making room by dropping GPU copies that have a copy below (oldest first);
        None if even then there is none: copies that must be copied down first are the background demotion's
        job. With tenants' GPU budgets the room is made in three steps (``store/tier_guard.py``): the tenant's
        own copies while it would pass its ceiling (else None, counted), the shared pool, its own guarantee."""
        gpu, size = self.gpu, entry.size
        attempt = lambda: gpu.allocate(size)  # noqa: E731
        guard = self.store.budgets.held("gpu")
        if guard is None:
            return make_room(attempt, self.lru, copied_below, self.start_demote)
        if not guard.keep_under_ceiling(entry.tenant, size, copied_below, self.start_demote):
            return None
        return guard.make_room(entry.tenant, attempt, copied_below, self.start_demote)

    def free(self, entry: Entry) -> None:
        if entry.gpu_offset is not None:
            self.gpu.free(entry.gpu_offset)
            entry.gpu_offset = None
            self.store.budgets.guards["gpu"].charge(entry, -entry.size)   # after the field: the guard reads it
            self.store.sync(entry.key)
            entry.hits = 0   # back up only on new repeated hits: a demoted chunk must not bounce straight back
            self.lru.remove(entry)


def copied_below(entry: Entry) -> bool:
    """Whether a GPU copy may be dropped at once: DRAM or a complete disk file holds the chunk too."""
    return entry.host_offset is not None or entry.disk is DiskState.STORED
