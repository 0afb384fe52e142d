"""Moving chunks between an engine's paged KV cache and the store's contiguous chunk layout.

    kv = PagedKV.from_vllm(kv_caches)                 # per-layer [2, num_blocks, block_size, heads, dim]
    chunk = gather(kv, block_ids)                     # one chunk: [layers, 2, tokens, heads*dim] as bytes
    scatter(kv, chunk, block_ids)                     # and back, into (other) blocks
    gather(kv, block_ids, out=slot)                   # straight into a reserved arena slot (one copy)
    scatter(kv, leased_view, block_ids, skip_blocks=1)  # from a leased view, leaving block 0 alone

Every connector moves paged KV through these two functions; ``kvstore.mapped.gpu_pool`` runs them on a side stream.

See ``paged.py`` for the layout model and ``registry.py`` for how the implementation is chosen.
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import torch_kernels
from .paged import ChunkShape, PagedKV, block_ids_tensor
from .registry import Kernels, select

__all__ = ["PagedKV", "ChunkShape", "gather", "scatter", "select", "Kernels"]


def _block_ids(kv: PagedKV, block_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    if not isinstance(block_ids, torch.Tensor):
        bad = [b for b in block_ids if not 0 <= b < kv.num_blocks]
        if bad:
            raise IndexError(f"block id {bad[0]} is outside the cache's {kv.num_blocks} blocks")
    return block_ids_tensor(block_ids, kv.device)


def _as_bytes(chunk: torch.Tensor, nbytes: int) -> torch.Tensor:
    if not chunk.is_contiguous():
        raise ValueError("the chunk tensor must be contiguous")
    flat = chunk.reshape(-1).view(torch.uint8)
    if flat.numel() != nbytes:
        raise ValueError(f"the chunk holds {flat.numel()} bytes; these blocks need {nbytes}")
    return flat


def gather(kv: PagedKV, block_ids: Sequence[int] | torch.Tensor, num_tokens: int | None = None,
           out: torch.Tensor | None = None, kernels: Kernels | None = None) -> torch.Tensor:
    """Copy the given blocks of every plane into one contiguous chunk (returned as bytes, or into ``out``,
    which may be any contiguous tensor of the right byte size on the cache's device)."""
    ids = _block_ids(kv, block_ids)
    tokens = kv.check_blocks(ids, num_tokens)
    nbytes = kv.chunk_shape(tokens).nbytes
    dst = torch.empty(nbytes, dtype=torch.uint8, device=kv.device) if out is None else _as_bytes(out, nbytes)
    if dst.device != kv.device:
        raise ValueError(f"gather writes on the cache's device {kv.device}; out is on {dst.device}")
    (kernels or select(kv.device)).gather(kv, ids, tokens, dst)
    return dst


def scatter(kv: PagedKV, chunk: torch.Tensor, block_ids: Sequence[int] | torch.Tensor,
            num_tokens: int | None = None, kernels: Kernels | None = None, skip_blocks: int = 0) -> None:
    """Copy one contiguous chunk into the given blocks of every plane. A chunk on another device (a host
    chunk for a GPU cache) is first copied over, asynchronously when it is pinned.

    ``skip_blocks``: the chunk's first blocks are left out (``block_ids[:skip_blocks]`` are not written): they
    are blocks the engine already holds, possibly shared with other requests."""
    ids = _block_ids(kv, block_ids)
    tokens = kv.check_blocks(ids, num_tokens)
    src = _as_bytes(chunk, kv.chunk_shape(tokens).nbytes)
    if src.device != kv.device:
        src = src.to(kv.device, non_blocking=True)
    if skip_blocks:
        if not 0 < skip_blocks <= ids.numel() or tokens != ids.numel() * kv.block_size:
            raise ValueError(f"cannot skip {skip_blocks} of {ids.numel()} blocks holding {tokens} tokens")
        torch_kernels.scatter_blocks(kv, src, ids, skip_blocks)
        return
    (kernels or select(kv.device)).scatter(kv, src, ids, tokens)
