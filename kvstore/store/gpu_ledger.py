"""The GPU tier's ledger: the ``Store`` methods that keep ``Entry.gpu_offset``, ``Entry.gpu_loading``,
``Entry.hits``, the GPU LRU and the promotion requests (``gpu_wanted``).

The GPU mover (``gpu_mover.py``) runs the copies between ``start_gpu_promote``/``finish_gpu_promote`` and
``start_gpu_demote``/``finish_gpu_demote`` and the watermark round (``gpu_over_high``, ``gpu_victim``). A mixin of
``Store``, like ``disk_ledger.py``: GPU slots are allocated and freed only here.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import StoreFullError
from .entry import DiskState, Entry
from .room import make_room

GPU_HIGH_WATERMARK = 0.95
GPU_LOW_WATERMARK = 0.85
GPU_PROMOTE_HITS = 2    # the second get that finds a chunk in DRAM asks for its promotion


class GpuLedger:
    """Methods of ``Store`` for the GPU tier (see the module docstring)."""

    def wants_gpu(self) -> bool:
        """Whether some chunk asked for a GPU promotion that the GPU mover has not taken yet."""
        return bool(self.gpu_wanted)

    def gpu_only(self, keys: Sequence[bytes]) -> list[Entry]:
        """The chunks of the longest stored prefix of ``keys`` that only the GPU tier holds in memory: what a
        reader without the GPU mapping needs copied down before it can read them."""
        return [e for e in self.leading(keys) if e.host_offset is None and e.gpu_offset is not None]

    def _count_hits(self, found: list[Entry]) -> None:
        for entry in found:
            if entry.gpu_offset is not None:
                continue
            entry.hits += 1
            if entry.hits >= GPU_PROMOTE_HITS and entry.gpu_loading is None:
                self.gpu_wanted[entry.key] = entry

    def start_gpu_promote(self, entry: Entry) -> int | None:
        """Give a DRAM chunk a GPU slot to be copied into; None if it is not promotable or no slot frees up."""
        if self.gpu is None or not entry.readable or self.index.get(entry.key) is not entry \
                or entry.host_offset is None or entry.gpu_offset is not None or entry.gpu_loading is not None:
            return None
        offset = self._allocate_gpu(entry.size)
        if offset is not None:
            entry.gpu_loading = offset
        return offset

    def finish_gpu_promote(self, entry: Entry, ok: bool) -> bool:
        """The copy into the GPU slot ended: publish the slot (or give it back on failure or delete)."""
        assert self.gpu is not None
        offset, entry.gpu_loading = entry.gpu_loading, None
        if not ok or entry.doomed:
            self.gpu.free(offset)
            if entry.doomed:
                self._release_if_idle(entry)
            return False
        entry.gpu_offset = offset
        self._sync(entry.key)
        if entry.pins == 0:
            self.gpu_lru.add_chain([entry])
        self.tier_counters.promotions_host_gpu += 1
        self.tier_counters.promoted_bytes_host_gpu += entry.size
        return True

    def gpu_over_high(self, leaving: int = 0) -> bool:
        return self.gpu is not None and self.gpu.used_bytes - leaving > GPU_HIGH_WATERMARK * self.gpu.capacity_bytes

    def gpu_over_low(self, leaving: int = 0) -> bool:
        return self.gpu is not None and self.gpu.used_bytes - leaving > GPU_LOW_WATERMARK * self.gpu.capacity_bytes

    def start_gpu_demote(self, entry: Entry, to_host: bool = False) -> int | None:
        """Move a chunk out of the GPU tier. Free at once when a DRAM copy exists, or a disk copy and
        ``to_host`` is false (returns None); otherwise returns the host slot the GPU slot must be copied into
        before ``finish_gpu_demote``. Raises StoreFullError when DRAM has no room for it."""
        assert self.gpu is not None
        self.gpu_lru.remove(entry)
        if entry.host_offset is not None or (entry.disk is DiskState.STORED and not to_host):
            to_host = entry.host_offset is not None
            self._free_gpu(entry)
            self._count_gpu_demotion(entry, "host" if to_host else "disk")
            return None
        try:
            entry.loading = self._allocate(entry.size)
        except StoreFullError:
            if entry.pins == 0:
                self.gpu_lru.push_oldest([entry])
            raise
        return entry.loading

    def gpu_victim(self) -> Entry | None:
        """The GPU chunk to demote next: the least recently used one that is not leased."""
        return self.gpu_lru.peek_oldest()

    def finish_gpu_demote(self, entry: Entry, ok: bool) -> None:
        """The copy down ended: the chunk lives in DRAM (and its GPU slot goes, unless it was leased meanwhile)."""
        offset, entry.loading = entry.loading, None
        if not ok or entry.doomed:
            self.host.free(offset)
            if entry.doomed:
                self._release_if_idle(entry)
            elif entry.pins == 0:
                self.gpu_lru.push_oldest([entry])
            return
        entry.host_offset = offset
        self._sync(entry.key)
        self.tier_counters.gpu_copies_down += 1
        if entry.pins == 0:
            self.lru.add_chain([entry])
            self._free_gpu(entry)
            self._count_gpu_demotion(entry, "host")
        if self.disk is not None and entry.disk is DiskState.NONE:
            entry.disk = DiskState.QUEUED   # it lost its queued write when it left DRAM for the GPU tier
            self.dirty.append(entry)
            self.dirty_bytes += entry.size
            self.disk_lru.add_newest(entry)
            if self.io is not None:
                self.io.wake_writer()

    def _count_gpu_demotion(self, entry: Entry, to: str) -> None:
        tc = self.tier_counters
        setattr(tc, f"demotions_gpu_{to}", getattr(tc, f"demotions_gpu_{to}") + 1)
        setattr(tc, f"demoted_bytes_gpu_{to}", getattr(tc, f"demoted_bytes_gpu_{to}") + entry.size)

    def _allocate_gpu(self, size: int) -> int | None:
        """A GPU slot, making room by dropping GPU copies that have a copy below (oldest first); None if even
        then there is none: copies that must be copied down first are the background demotion's job."""
        assert self.gpu is not None
        gpu = self.gpu
        return make_room(lambda: gpu.allocate(size), self.gpu_lru,
                         lambda e: e.host_offset is not None or e.disk is DiskState.STORED, self.start_gpu_demote)

    def _free_gpu(self, entry: Entry) -> None:
        if entry.gpu_offset is not None:
            assert self.gpu is not None
            self.gpu.free(entry.gpu_offset)
            entry.gpu_offset = None
            self._sync(entry.key)
            entry.hits = 0   # back up only on new repeated hits: a demoted chunk must not bounce straight back
            self.gpu_lru.remove(entry)
