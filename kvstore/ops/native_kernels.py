"""Gather/scatter through the native kernels (one call per chunk for all planes), with the torch path as
the fallback for what they do not cover (a partly used last block, planes with different row strides)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from . import torch_kernels
from .paged import PagedKV


@dataclass
class _PlaneTable:
    """The planes' base addresses, where the kernel reads them (host memory for C, device memory for CUDA)."""

    ptrs: torch.Tensor
    aligned16: bool


def _table(kv: PagedKV) -> _PlaneTable:
    state = kv._native_state
    if isinstance(state, _PlaneTable):
        return state
    addresses = [r.data_ptr() for r in kv.rows]
    aligned = kv.row_bytes % 16 == 0 and kv.row_stride % 16 == 0 and all(a % 16 == 0 for a in addresses)
    table = _PlaneTable(torch.tensor(addresses, dtype=torch.int64, device=kv.device), aligned)
    kv._native_state = table
    return table


def _covered(kv: PagedKV, block_ids: torch.Tensor, tokens: int) -> bool:
    return kv.uniform_stride and tokens == block_ids.numel() * kv.block_size


def _run(kv: PagedKV, block_ids: torch.Tensor, chunk: torch.Tensor, to_chunk: bool) -> None:
    from . import native   # here, so that `python -m kvstore.ops.native` runs a module not yet imported

    table = _table(kv)
    index = block_ids.contiguous()
    if kv.device.type == "cpu":
        lib = native.load("cpu")
        assert lib is not None
        bad = lib.kvstore_copy_rows_cpu(table.ptrs.data_ptr(), len(kv.rows), kv.row_stride, kv.row_bytes,
                                        index.data_ptr(), index.numel(), kv.num_blocks, chunk.data_ptr(),
                                        int(to_chunk), torch.get_num_threads())
        if bad:
            raise IndexError(f"block id {int(index[bad - 1])} is outside the cache's {kv.num_blocks} blocks")
        return
    lib = native.load("cuda")
    assert lib is not None
    stream = torch.cuda.current_stream(kv.device).cuda_stream
    vec16 = table.aligned16 and chunk.data_ptr() % 16 == 0
    err = lib.kvstore_copy_rows_cuda(table.ptrs.data_ptr(), len(kv.rows), kv.row_stride, kv.row_bytes,
                                     index.data_ptr(), index.numel(), kv.num_blocks, ctypes.c_void_p(chunk.data_ptr()),
                                     int(to_chunk), int(vec16), ctypes.c_void_p(stream))
    if err:
        raise RuntimeError(f"native CUDA gather/scatter failed to launch (cudaError {err})")


def gather(kv: PagedKV, block_ids: torch.Tensor, tokens: int, out: torch.Tensor) -> None:
    if not _covered(kv, block_ids, tokens):
        torch_kernels.gather(kv, block_ids, tokens, out)
        return
    _run(kv, block_ids, out, to_chunk=True)


def scatter(kv: PagedKV, chunk: torch.Tensor, block_ids: torch.Tensor, tokens: int) -> None:
    if not _covered(kv, block_ids, tokens):
        torch_kernels.scatter(kv, chunk, block_ids, tokens)
        return
    _run(kv, block_ids, chunk, to_chunk=False)
