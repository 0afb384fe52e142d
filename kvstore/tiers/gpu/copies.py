"""Asynchronous copies between the device pool and host memory, tracked by events.

The daemon never blocks its event loop on a copy. A copy is queued on a dedicated CUDA stream (one per
direction, so a demotion and a promotion use both copy engines at once) and an event is recorded after it;
the caller keeps the ``Transfer`` and polls ``done()`` from its background loop, and only then frees the
source slot or publishes the destination. Copies between the device and *page-locked* host memory are truly
asynchronous DMA at PCIe speed; with pageable memory CUDA stages them and they complete before returning.

On a CPU device (tests) the same calls copy synchronously and return a transfer that is already done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Transfer:
    """One queued copy. ``event`` is None when the copy already completed (CPU, or nothing to wait for)."""

    nbytes: int
    event: Any = None

    def done(self) -> bool:
        return self.event is None or bool(self.event.query())

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()


class CopyEngine:
    """Streams and events for one device; ``copy`` queues ``dst.copy_(src)`` and returns its ``Transfer``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.to_device = torch.cuda.Stream(device)
            self.to_host = torch.cuda.Stream(device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> Transfer:
        if dst.numel() != src.numel():
            raise ValueError(f"copy of {src.numel()} bytes into a {dst.numel()}-byte slot")
        if not self.cuda:
            dst.copy_(src)
            return Transfer(dst.numel())
        stream = self.to_host if dst.device.type == "cpu" else self.to_device
        # The copy must not start before work already queued on the default stream that touches these bytes.
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return Transfer(dst.numel(), event)
