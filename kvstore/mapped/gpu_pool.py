"""Engine side of the GPU tier: map the daemon's pool once, move chunks on the engine's own stream.

``MappedPool.from_hello`` maps the pool the daemon exported in its HELLO reply (or returns None, and the
engine reads from the host tier instead: the GPU tier is an optimisation). A chunk leased from the GPU tier is
then ``pool.view(offset, size)``, a device tensor, and loading it into the engine's paged cache is one
device-to-device scatter on a side stream. Nothing blocks the host: ``load_async`` returns an event; the
engine makes its compute stream wait on it (``torch.cuda.current_stream().wait_event(event)``) and releases the
lease once ``event.query()`` is true. ``save_async`` is the mirror image: gather on a side stream into a
reserved slot (a GPU-pool view, or a page-locked host-arena slot), and commit once the event has completed.

``page_lock_mapping`` page-locks an engine's own mapping of the shared host arena, so that loads from and saves to
the host tier are asynchronous DMA too.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import logs
from ..ops import PagedKV, gather, scatter
from .pool_ipc import PoolExport, import_pool
from .page_lock import PageLockedRegion, page_lock


class MappedPool:
    """The daemon's GPU pool as seen from an engine process."""

    def __init__(self, buffer: torch.Tensor, export: PoolExport | None, mapping: Any = None) -> None:
        self.buffer = buffer
        self.export = export
        self._mapping = mapping   # the shared file of a CPU-backed test pool (None for CUDA IPC)

    @classmethod
    def from_hello(cls, info: dict[str, Any] | None) -> "MappedPool | None":
        if not info:
            return None
        try:
            if info.get("device") == "cpu":
                return cls._map_cpu_pool(info)
            export = PoolExport.from_wire(info)
            return cls(import_pool(export), export)
        except Exception as exc:  # noqa: BLE001 - no mapping means host-tier reads, never a failure
            logs.warning("gpu_pool_unmapped", reason=repr(exc), fallback="host tier")
            return None

    @classmethod
    def _map_cpu_pool(cls, info: dict[str, Any]) -> "MappedPool":
        """The CPU-backed pool of a daemon started with the testing switch (``tiers/gpu/settings.py``)."""
        from .arena import SharedArena

        nbytes = int(info["nbytes"])
        mapping = SharedArena.attach(str(info["path"]), nbytes)
        return cls(torch.frombuffer(mapping.buf, dtype=torch.uint8, count=nbytes), None, mapping)

    @property
    def device(self) -> torch.device:
        return self.buffer.device

    def close(self) -> None:
        """Drop this process's mapping (views taken from it must be gone first)."""
        self.buffer = torch.empty(0, dtype=torch.uint8, device=self.buffer.device)
        if self._mapping is not None:
            self._mapping.close()
            self._mapping = None

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.buffer.numel():
            raise ValueError(f"slot {offset}+{nbytes} is outside the {self.buffer.numel()}-byte GPU pool")
        return self.buffer[offset:offset + nbytes]


def page_lock_mapping(buf: Any, nbytes: int, read_only: bool = False) -> PageLockedRegion:
    """Page-lock an engine's mapping of the shared arena (logged fallback to pageable when it cannot);
    ``read_only``: its read-only mapping, which the device only reads from."""
    return page_lock(buf, nbytes, who="engine-reads" if read_only else "engine", read_only=read_only)


def _side_stream(kv: PagedKV, stream: Any) -> Any:
    return stream if stream is not None else torch.cuda.Stream(kv.device)


def _ordered_side(kv: PagedKV, stream: Any, after: Any) -> Any:
    """A side stream that starts after ``after`` (an event), or after the current stream's work so far."""
    side = _side_stream(kv, stream)
    if after is not None:
        side.wait_event(after)
    else:
        side.wait_stream(torch.cuda.current_stream(kv.device))
    return side


def load_async(kv: PagedKV, chunk: torch.Tensor, block_ids: Sequence[int] | torch.Tensor,
               num_tokens: int | None = None, stream: Any = None, skip_blocks: int = 0, after: Any = None) -> Any:
    """Scatter one chunk (a GPU-pool view, or a page-locked host slot) into the paged cache on ``stream``.

    ``skip_blocks`` leaves the chunk's first blocks out (see ``kvstore.ops.scatter``); ``after``: an event the
    copy waits for (default: the current stream's work so far, which allocated the blocks). Returns the event
    recorded after the copy (None on CPU, where the copy is already done)."""
    if kv.device.type != "cuda":
        scatter(kv, chunk, block_ids, num_tokens, skip_blocks=skip_blocks)
        return None
    side = _ordered_side(kv, stream, after)
    with torch.cuda.stream(side):
        scatter(kv, chunk, block_ids, num_tokens, skip_blocks=skip_blocks)
        event = torch.cuda.Event()
        event.record(side)
    return event


def save_async(kv: PagedKV, block_ids: Sequence[int] | torch.Tensor, slot: torch.Tensor,
               num_tokens: int | None = None, stream: Any = None, after: Any = None) -> Any:
    """Gather blocks into a reserved slot (GPU-pool view: directly; host slot: via a device staging buffer).

    ``after``: the event after which the blocks hold the KV (default: the current stream's work so far).
    Returns the event to wait for before COMMIT (None on CPU, where the copy is already done)."""
    if kv.device.type != "cuda":
        if slot.device == kv.device:
            gather(kv, block_ids, num_tokens, out=slot)
        else:
            slot.view(torch.uint8).reshape(-1).copy_(gather(kv, block_ids, num_tokens))
        return None
    side = _ordered_side(kv, stream, after)
    with torch.cuda.stream(side):
        if slot.device == kv.device:
            gather(kv, block_ids, num_tokens, out=slot)
        else:
            staged = gather(kv, block_ids, num_tokens)
            slot.view(torch.uint8).reshape(-1).copy_(staged, non_blocking=True)
            staged.record_stream(side)
        event = torch.cuda.Event()
        event.record(side)
    return event
