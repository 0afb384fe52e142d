"""A byte pool on one device, carved into chunk slots by the extent allocator.

The pool is one ``uint8`` tensor allocated once at start (``torch.empty`` on ``cuda:N`` in the daemon, on
``cpu`` in tests: the bookkeeping is the same code). One allocation means one CUDA IPC handle for the whole
tier, so an engine maps it once at connect time and every chunk afterwards is an (offset, size) into that
mapping. In tests the pool may instead lie in a caller's shared-memory buffer on ``cpu`` (``backing``), so that
another process maps it the way an engine maps the CUDA pool. Slots are aligned to ``ALIGN`` bytes (4 KiB), which keeps
every slot 16-byte aligned for vectorised copies; allocation and free are O(1) (``kvstore.tiers.allocator``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..allocator import ExtentAllocator, ExtentSpace

ALIGN = 4096


class DevicePool(ExtentSpace):
    """``capacity`` bytes on ``device``; hands out byte ranges and tensor views of them."""

    def __init__(self, capacity: int, device: torch.device | str, backing: Any = None) -> None:
        if capacity < ALIGN:
            raise ValueError(f"a device pool needs at least {ALIGN} bytes, got {capacity}")
        self.device = torch.device(device)
        size = capacity // ALIGN * ALIGN
        if backing is None:
            self.buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        elif self.device.type == "cpu":
            self.buffer = torch.frombuffer(backing, dtype=torch.uint8, count=size)
        else:
            raise ValueError(f"only a cpu pool can lie in a host buffer; this one is on {self.device}")
        self.allocator = ExtentAllocator(self.buffer.numel(), ALIGN)

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        """The bytes of a slot, as a 1-D ``uint8`` tensor sharing the pool's memory."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.buffer.numel():
            raise ValueError(f"range {offset}+{nbytes} is outside the {self.buffer.numel()}-byte pool")
        return self.buffer[offset:offset + nbytes]

    def close(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8, device=self.device)
