"""What `bench/serve_sglang.py` adds to the engine tests' CPU shim (`harness/engines/sglang_cpu_shim`), for
every arm's server and client alike; first on ``PYTHONPATH``, so Python imports this ``sitecustomize`` instead of
the shim's, and this one installs the shim. Only under ``SGLANG_USE_CPU_ENGINE=1``:

* SGLang's host reserve, ``HICACHE_HOST_MEMORY_RESERVE_BYTES`` (``sglang.srt.mem_cache.pool_host.base``), 10 GiB
  that a HiCache host pool may never take: a server refuses to start with less available, even for a pool of a
  few MiB, which four servers on a small machine shared with other work meet. Lowered to ``HOST_RESERVE_GIB``.
* The ``direct`` I/O kernels of the ``page_first_direct`` host layout, which SGLang's ``mooncake`` backend
  switches HiCache to (it refuses ``layer_first``): ``transfer_kv_per_layer_direct_pf_lf`` and
  ``transfer_kv_all_layer_direct_lf_pf`` are bound in ``sglang.srt.mem_cache.pool_host.mha`` only on CUDA, ROCm
  and XPU; here in PyTorch, from their call sites (a ``page_first_direct`` buffer is
  ``[pages, layers, page_size, heads, head_dim]`` per plane, a device layer ``[tokens, heads, head_dim]``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

HOST_RESERVE_GIB = 1


def transfer_kv_per_layer_direct_pf_lf(src_ptrs: Sequence[Any], dst_ptrs: Sequence[Any], src_indices: Any,
                                       dst_indices: Any, layer_id: int, page_size: int) -> None:
    """Host (page_first_direct) to device, one layer: each plane's rows at host slots `src_indices` of layer
    `layer_id` into the device layer's rows `dst_indices`."""
    import torch

    slots = src_indices.to(torch.int64)
    pages, offsets = slots // page_size, slots % page_size
    for src, dst in zip(src_ptrs, dst_ptrs):
        rows = src[pages, layer_id, offsets]
        dst.index_copy_(0, dst_indices.to(dst.device, torch.int64), rows.to(dst.device, dst.dtype))


def transfer_kv_all_layer_direct_lf_pf(src_ptrs: Sequence[Any], dst_ptrs: Sequence[Any], src_indices: Any,
                                       dst_indices: Any, page_size: int) -> None:
    """Device to host (page_first_direct), every layer: `src_ptrs` holds each plane's layers in turn (K's layers,
    then V's), `dst_ptrs` one buffer per plane; device rows `src_indices` go to host slots `dst_indices`."""
    import torch

    layers = len(src_ptrs) // len(dst_ptrs)
    slots = dst_indices.to(torch.int64)
    pages, offsets = slots // page_size, slots % page_size
    rows = src_indices.to(torch.int64)
    for plane, dst in enumerate(dst_ptrs):
        for layer in range(layers):
            src = src_ptrs[plane * layers + layer]
            dst[pages, layer, offsets] = src.index_select(0, rows.to(src.device)).to(dst.device, dst.dtype)


def _install() -> None:
    import sglang_cpu_kernels

    after = sglang_cpu_kernels.AFTER_IMPORT
    base_patch, mha_patch = after["sglang.srt.mem_cache.pool_host.base"], after["sglang.srt.mem_cache.pool_host.mha"]

    def base(module: Any) -> None:
        base_patch(module)
        module.HICACHE_HOST_MEMORY_RESERVE_BYTES = HOST_RESERVE_GIB * 1024 ** 3

    def mha(module: Any) -> None:
        mha_patch(module)
        for fn in (transfer_kv_per_layer_direct_pf_lf, transfer_kv_all_layer_direct_lf_pf):
            if not hasattr(module, fn.__name__):
                setattr(module, fn.__name__, fn)

    after["sglang.srt.mem_cache.pool_host.base"] = base
    after["sglang.srt.mem_cache.pool_host.mha"] = mha
    sglang_cpu_kernels.install()


if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
    _install()
