"""Which gather/scatter implementation runs, per device type.

Two implementations exist: ``torch`` (portable, one indexing op per plane) and ``native`` (one C or CUDA call
per chunk, ``kvstore/native/copy.py``). ``DEFAULTS`` records what ``bench/gather_scatter.py`` (CPU) and
``bench/gpu_check.py`` (CUDA) measured to be faster; ``native`` is only used when its library is built and
loads, otherwise the torch path runs. ``KVSTORE_KERNELS=torch|native`` overrides the default for every device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from ..native import copy as native_copy
from . import torch_kernels
from .paged import PagedKV

GatherFn = Callable[[PagedKV, torch.Tensor, int, torch.Tensor], None]
ScatterFn = Callable[[PagedKV, torch.Tensor, torch.Tensor, int], None]


@dataclass(frozen=True)
class Kernels:
    name: str
    gather: GatherFn
    scatter: ScatterFn


TORCH = Kernels("torch", torch_kernels.gather, torch_kernels.scatter)
NATIVE = Kernels("native", native_copy.gather, native_copy.scatter)
IMPLEMENTATIONS = {k.name: k for k in (TORCH, NATIVE)}

# Measured defaults per device type and direction (see the module docstring; the figures are in
# bench/results/gather_scatter_cpu.json). On CPU torch's index_copy_ scatters byte by byte, which the C path's
# one memcpy per row beats by far, while torch's index_select already copies whole rows and gathers a large
# chunk as fast as the C path; so on CPU the C path scatters and torch gathers.
DEFAULTS: dict[str, dict[str, str]] = {
    "cpu": {"gather": "torch", "scatter": "native"},
    "cuda": {"gather": "native", "scatter": "native"},
}


def native_available(device_type: str) -> bool:
    """Whether the native kernels can run on ``device_type`` (built, and for CUDA compiled through cupy)."""
    return native_copy.available(device_type)


def select(device: torch.device, name: str | None = None) -> Kernels:
    """The implementation to use on ``device``: ``name`` if given, else the override or the measured defaults
    (which may differ per direction), falling back to torch when the native library is not available there."""
    wanted = name or os.environ.get("KVSTORE_KERNELS")
    if wanted is None:
        per_op = DEFAULTS.get(device.type, {})
        gather_impl = _pick(device, per_op.get("gather", "torch"), False)
        scatter_impl = _pick(device, per_op.get("scatter", "torch"), False)
        if gather_impl is scatter_impl:
            return gather_impl
        return Kernels(f"gather:{gather_impl.name},scatter:{scatter_impl.name}", gather_impl.gather,
                       scatter_impl.scatter)
    return _pick(device, wanted, name == "native")


NOT_AVAILABLE = {
    "cpu": "the C library was not built (reinstall kvstore where a C compiler with OpenMP is at hand)",
    "cuda": "they need cupy (pip install 'kvstore[gpu]') and a GPU",
}


def _pick(device: torch.device, wanted: str, strict: bool) -> Kernels:
    if wanted not in IMPLEMENTATIONS:
        raise ValueError(f"unknown gather/scatter implementation {wanted!r}; choose one of {sorted(IMPLEMENTATIONS)}")
    if wanted == "native" and not native_available(device.type):
        if strict:
            why = NOT_AVAILABLE.get(device.type, "there are none for this device type")
            raise RuntimeError(f"the native kernels for {device.type} are not available: {why}")
        return TORCH
    return IMPLEMENTATIONS[wanted]
