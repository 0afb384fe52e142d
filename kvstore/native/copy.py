"""Gather/scatter through the native kernels (one call per chunk for all planes), with the torch path as the
fallback for what they do not cover (a partly used last block, planes with different row strides).

On the host the C library (``_kvstore_copy.so``, ``native/kvstore_copy.c``) runs it; on a GPU the CUDA kernel
compiled through cupy (``cuda.py``). ``kvstore.ops.registry`` decides where these are used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from . import cuda, load

if TYPE_CHECKING:
    from ..ops.paged import PagedKV


@dataclass
class _PlaneTable:
    """The planes' base addresses, where the kernel reads them (host memory for C, device memory for CUDA)."""

    ptrs: torch.Tensor
    aligned16: bool


def available(device_type: str) -> bool:
    """Whether the native gather/scatter can run on ``device_type`` (``cpu``: the C library is built; ``cuda``:
    cupy is installed and the kernel compiles for the current device)."""
    if device_type == "cpu":
        return load("copy") is not None
    if device_type != "cuda" or not torch.cuda.is_available():
        return False
    kernels = cuda.module()
    if kernels is None:
        return False
    try:
        kernels.functions(torch.cuda.current_device())
    except RuntimeError:
        return False
    return True


def _table(kv: PagedKV) -> _PlaneTable:
    state = kv.kernel_state
    if isinstance(state, _PlaneTable):
        return state
    addresses = [r.data_ptr() for r in kv.rows]
    aligned = kv.row_bytes % 16 == 0 and kv.row_stride % 16 == 0 and all(a % 16 == 0 for a in addresses)
    table = _PlaneTable(torch.tensor(addresses, dtype=torch.int64, device=kv.device), aligned)
    kv.kernel_state = table
    return table


def _covered(kv: PagedKV, block_ids: torch.Tensor, tokens: int) -> bool:
    return kv.uniform_stride and tokens == block_ids.numel() * kv.block_size


def _run(kv: PagedKV, block_ids: torch.Tensor, chunk: torch.Tensor, to_chunk: bool) -> None:
    table = _table(kv)
    index = block_ids.contiguous()
    if kv.device.type == "cpu":
        lib = load("copy")
        assert lib is not None
        bad = lib.kvstore_copy_rows_cpu(table.ptrs.data_ptr(), len(kv.rows), kv.row_stride, kv.row_bytes,
                                        index.data_ptr(), index.numel(), kv.num_blocks, chunk.data_ptr(),
                                        int(to_chunk), torch.get_num_threads())
        if bad:
            raise IndexError(f"block id {int(index[bad - 1])} is outside the cache's {kv.num_blocks} blocks")
        return
    kernels = cuda.module()
    assert kernels is not None
    launch = cuda.plan(index.numel(), len(kv.rows), kv.row_bytes, table.aligned16 and chunk.data_ptr() % 16 == 0)
    if launch is None:
        return
    stream = torch.cuda.current_stream(kv.device).cuda_stream
    device = kv.device.index if kv.device.index is not None else torch.cuda.current_device()
    kernels.copy_rows(launch, device, stream, (table.ptrs.data_ptr(), kv.row_stride, index.data_ptr(),
                                               index.numel(), kv.num_blocks, chunk.data_ptr(), int(to_chunk)))


def gather(kv: PagedKV, block_ids: torch.Tensor, tokens: int, out: torch.Tensor) -> None:
    """Copy ``block_ids``' rows of every plane into ``out`` (the torch path where the kernel does not cover)."""
    from ..ops import torch_kernels   # here: importing kvstore.ops imports this module (through the registry)

    if not _covered(kv, block_ids, tokens):
        torch_kernels.gather(kv, block_ids, tokens, out)
        return
    _run(kv, block_ids, out, to_chunk=True)


def scatter(kv: PagedKV, chunk: torch.Tensor, block_ids: torch.Tensor, tokens: int) -> None:
    """Copy ``chunk`` into ``block_ids``' rows of every plane (the torch path where the kernel does not cover)."""
    from ..ops import torch_kernels

    if not _covered(kv, block_ids, tokens):
        torch_kernels.scatter(kv, chunk, block_ids, tokens)
        return
    _run(kv, block_ids, chunk, to_chunk=False)
