"""Which gather/scatter implementation runs, per device type.

Two implementations exist: ``torch`` (portable, one indexing op per plane) and ``native`` (one C or CUDA call
per chunk, see ``native/``). ``DEFAULTS`` records what ``bench/gather_scatter.py`` (CPU) and
``bench/gpu_check.py`` (CUDA) measured to be faster; ``native`` is only used when its library is built and
loads, otherwise the torch path runs. ``KVSTORE_KERNELS=torch|native`` overrides the default for every device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from . import native, native_kernels, torch_kernels
from .paged import PagedKV

GatherFn = Callable[[PagedKV, torch.Tensor, int, torch.Tensor], None]
ScatterFn = Callable[[PagedKV, torch.Tensor, torch.Tensor, int], None]


@dataclass(frozen=True)
class Kernels:
    name: str
    gather: GatherFn
    scatter: ScatterFn


TORCH = Kernels("torch", torch_kernels.gather, torch_kernels.scatter)
NATIVE = Kernels("native", native_kernels.gather, native_kernels.scatter)
IMPLEMENTATIONS = {k.name: k for k in (TORCH, NATIVE)}

# Measured defaults (see the module docstring). CPU: bench/results/gather_scatter_cpu.json.
DEFAULTS: dict[str, str] = {"cpu": "torch", "cuda": "native"}


def native_available(device_type: str) -> bool:
    return device_type in ("cpu", "cuda") and native.load(device_type) is not None


def select(device: torch.device, name: str | None = None) -> Kernels:
    """The implementation to use on ``device``: ``name`` if given, else the override or the measured default,
    falling back to torch when the native library is not available there."""
    wanted = name or os.environ.get("KVSTORE_KERNELS") or DEFAULTS.get(device.type, "torch")
    if wanted not in IMPLEMENTATIONS:
        raise ValueError(f"unknown gather/scatter implementation {wanted!r}; choose one of {sorted(IMPLEMENTATIONS)}")
    if wanted == "native" and not native_available(device.type):
        if name == "native":
            raise RuntimeError(f"the native kernels for {device.type} are not built; run python -m kvstore.ops.native")
        return TORCH
    return IMPLEMENTATIONS[wanted]
