"""The GPU HBM tier: hot chunks in a device pool that engines on the same GPU map by CUDA IPC.

Same small interface as the host tier (``allocate``, ``free``, ``read``, ``write``, ``usage``, ``close``), so
the GPU mover treats it as the top tier; in addition, ``copy_to_host`` and ``copy_from_host`` move one
chunk to or from a slot of the (page-locked) host arena asynchronously and return a ``Transfer`` that the mover
polls. Contract with the GPU mover:

* demote (gpu → host): allocate the host slot, ``copy_to_host``, and only when the transfer is ``done()``
  point the entry at the host slot and ``free`` the GPU slot. A leased chunk is never demoted.
* promote (host → gpu): allocate a GPU slot, ``copy_from_host``, and only when done point the entry at it and
  free the host slot (or keep both and drop either later: the bytes are identical).

The tier also owns the page-locked registration of the host arena, so that the daemon page-locks and unlocks in one
place. Everything runs on CPU tensors in tests (``device="cpu"``): same bookkeeping, synchronous copies; with
``shared_path`` the CPU pool is a shared-memory file that clients map instead of a CUDA IPC handle.
"""

from __future__ import annotations

from typing import Any

import torch

from ..allocator import ExtentSpace
from ...mapped.arena import SharedArena
from .copies import CopyEngine, Transfer
from ...mapped.pool_ipc import PoolExport, export_pool
from ...mapped.page_lock import PageLockedRegion, page_lock
from .pool import DevicePool


def host_tensor(buf: Any, nbytes: int) -> torch.Tensor:
    """A ``uint8`` tensor over the first ``nbytes`` of a writable host buffer (the shared arena)."""
    return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes)


class GpuTier(ExtentSpace):
    name = "gpu"

    def __init__(self, capacity: int, device: torch.device | str, host_buf: Any | None = None,
                 host_nbytes: int = 0, shared_path: str | None = None) -> None:
        self.shared: SharedArena | None = None
        if shared_path is not None and torch.device(device).type == "cpu":
            self.shared = SharedArena.create(shared_path, capacity)
        self.pool = DevicePool(capacity, device, self.shared.buf if self.shared is not None else None)
        self.allocator = self.pool.allocator
        self.copies = CopyEngine(self.pool.device)
        self.host: torch.Tensor | None = None
        self.page_locked: PageLockedRegion | None = None
        if host_buf is not None:
            if self.pool.device.type == "cuda":
                self.page_locked = page_lock(host_buf, host_nbytes)
            self.host = host_tensor(host_buf, host_nbytes)

    # -- the tier interface --------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.pool.device

    def read(self, offset: int, nbytes: int) -> torch.Tensor:
        """A device view of a stored chunk (valid while the chunk is pinned)."""
        return self.pool.view(offset, nbytes)

    def write(self, offset: int, data: Any) -> None:
        """Copy bytes (a bytes-like object or a tensor on any device) into a slot, synchronously."""
        src = data if isinstance(data, torch.Tensor) else torch.frombuffer(bytearray(data), dtype=torch.uint8)
        src = src.reshape(-1).view(torch.uint8)
        self.pool.view(offset, src.numel()).copy_(src)

    # -- moving chunks between this tier and the host arena ---------------------------------------------------
    def _host_slot(self, host_offset: int, nbytes: int) -> torch.Tensor:
        if self.host is None:
            raise RuntimeError("this GPU tier was opened without a host arena")
        if host_offset < 0 or host_offset + nbytes > self.host.numel():
            raise ValueError(f"range {host_offset}+{nbytes} is outside the {self.host.numel()}-byte host arena")
        return self.host[host_offset:host_offset + nbytes]

    def copy_to_host(self, offset: int, nbytes: int, host_offset: int) -> Transfer:
        """Queue gpu slot → host arena slot (demotion). Free the GPU slot only once the transfer is done."""
        return self.copies.copy(self._host_slot(host_offset, nbytes), self.pool.view(offset, nbytes))

    def copy_from_host(self, host_offset: int, nbytes: int, offset: int) -> Transfer:
        """Queue host arena slot → gpu slot (promotion). Publish the GPU slot only once the transfer is done."""
        return self.copies.copy(self.pool.view(offset, nbytes), self._host_slot(host_offset, nbytes))

    # -- sharing --------------------------------------------------------------------------------------------
    def export(self) -> PoolExport | None:
        """What an engine on the same GPU needs to map the pool (None on a CPU pool: nothing to share)."""
        if self.pool.device.type != "cuda":
            return None
        return export_pool(self.pool.buffer)

    def hello_info(self) -> dict[str, Any] | None:
        """The ``gpu`` field of the HELLO reply (msgpack-friendly), or None."""
        if self.shared is not None:  # the CPU-backed test tier: a file to map, like the host arena
            return {"capacity": self.capacity_bytes, "pinned_host": False, "device": "cpu",
                    "path": self.shared.path, "nbytes": self.pool.buffer.numel()}
        export = self.export()
        if export is None:
            return None
        return {"capacity": self.capacity_bytes, "pinned_host": bool(self.page_locked and self.page_locked.locked),
                **export.to_wire()}

    def close(self) -> None:
        if self.copies.cuda:
            torch.cuda.synchronize(self.pool.device)
        self.host = None
        if self.page_locked is not None:
            self.page_locked.unlock()
            self.page_locked = None
        self.pool.close()
        if self.shared is not None:
            self.shared.close()
            self.shared = None
