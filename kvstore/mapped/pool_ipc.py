"""Sharing the device pool with engines on the same GPU through CUDA IPC.

The daemon exports its pool tensor with torch's CUDA IPC support (``UntypedStorage._share_cuda_``): a memory
handle plus torch's reference-counter and event handles, all plain bytes and integers, so they travel in a
msgpack header. An engine rebuilds the storage with ``UntypedStorage._new_shared_cuda`` once, at connect time,
and from then on a chunk is an (offset, size) view of that mapping: loads are device-to-device copies on the
engine's own stream, with no daemon round trip per byte.

Devices are matched by UUID, not by index: ``CUDA_VISIBLE_DEVICES`` may number the same GPU differently in the
daemon and in the engine. CUDA IPC needs two different processes; a process cannot open its own handle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class PoolExport:
    """What an engine needs to map the daemon's pool (msgpack-friendly through ``to_wire``)."""

    device_uuid: str
    nbytes: int
    tensor_offset: int
    share: tuple      # the 8 fields of UntypedStorage._share_cuda_()

    def to_wire(self) -> dict[str, Any]:
        return {"device_uuid": self.device_uuid, "nbytes": self.nbytes, "tensor_offset": self.tensor_offset,
                "share": list(self.share)}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> "PoolExport":
        try:
            share = tuple(data["share"])
            if len(share) != 8:
                raise ValueError("share must have 8 fields")
            return cls(str(data["device_uuid"]), int(data["nbytes"]), int(data["tensor_offset"]), share)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed GPU pool export: {exc}") from None


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def local_index(uuid: str) -> int | None:
    """This process's index of the GPU with ``uuid``, or None when it is not visible here."""
    if not torch.cuda.is_available():
        return None
    for i in range(torch.cuda.device_count()):
        if device_uuid(i) == uuid:
            return i
    return None


def export_pool(buffer: torch.Tensor) -> PoolExport:
    """Export a CUDA tensor's memory for other processes."""
    if buffer.device.type != "cuda":
        raise ValueError(f"only CUDA memory can be shared by CUDA IPC; the pool is on {buffer.device}")
    share = buffer.untyped_storage()._share_cuda_()
    return PoolExport(device_uuid(buffer.device.index or 0), buffer.numel(), int(buffer.storage_offset()), tuple(share))


def import_pool(export: PoolExport) -> torch.Tensor:
    """Map an exported pool in this process: a ``uint8`` tensor of ``export.nbytes`` on the same GPU."""
    index = local_index(export.device_uuid)
    if index is None:
        raise RuntimeError(f"the daemon's GPU {export.device_uuid} is not visible in this process")
    _, handle, size, offset, ref_handle, ref_offset, event_handle, event_sync = export.share
    torch.cuda._lazy_init()
    storage = torch.UntypedStorage._new_shared_cuda(index, handle, size, offset, ref_handle, ref_offset,
                                                    event_handle, event_sync)
    flat = torch.empty(0, dtype=torch.uint8, device=f"cuda:{index}").set_(storage)
    return flat[export.tensor_offset:export.tensor_offset + export.nbytes]
