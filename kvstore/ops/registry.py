"""Which gather/scatter implementation runs, per device type.

Two implementations exist: ``torch`` (portable, one indexing op per plane) and ``native`` (one C or CUDA call
per chunk, see ``native_src/``). ``DEFAULTS`` records what ``bench/gather_scatter.py`` (CPU) and
``bench/gpu_check.py`` (CUDA) measured to be faster; ``native`` is only used when its library is built and
loads, otherwise the torch path runs. ``KVSTORE_KERNELS=torch|native`` overrides the default for every device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from . import native_kernels, torch_kernels
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

# Measured defaults per device type and direction (see the module docstring). CPU, from
# bench/results/gather_scatter_cpu.json: the C path scatters 15-190x faster than index_copy_ (which copies
# byte by byte) and wins both directions on small chunks, but torch's index_select (row memcpy) gathers a
# 32 MiB chunk as fast or faster; so on CPU the C path scatters and torch gathers.
DEFAULTS: dict[str, dict[str, str]] = {
    "cpu": {"gather": "torch", "scatter": "native"},
    "cuda": {"gather": "native", "scatter": "native"},
}


def native_available(device_type: str) -> bool:
    from . import native   # here, so that `python -m kvstore.ops.native` runs a module not yet imported

    return device_type in ("cpu", "cuda") and native.load(device_type) is not None


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


def _pick(device: torch.device, wanted: str, strict: bool) -> Kernels:
    if wanted not in IMPLEMENTATIONS:
        raise ValueError(f"unknown gather/scatter implementation {wanted!r}; choose one of {sorted(IMPLEMENTATIONS)}")
    if wanted == "native" and not native_available(device.type):
        if strict:
            raise RuntimeError(f"the native kernels for {device.type} are not built; run python -m kvstore.ops.native")
        return TORCH
    return IMPLEMENTATIONS[wanted]
