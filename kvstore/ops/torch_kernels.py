"""The portable gather/scatter: torch indexing, one ``index_select`` / ``index_copy_`` per plane.

Works on every device torch supports and needs no compiler. Each plane costs one operator dispatch (a few
microseconds on CPU, one kernel launch on CUDA), so a 32-layer model pays 64 of them per chunk; the native
kernels do the whole chunk in one call. Rows are whole blocks, so each indexed copy moves ``row_bytes`` at a time.
"""

from __future__ import annotations

import torch

from .paged import PagedKV, token_slots


def _rows_and_index(kv: PagedKV, block_ids: torch.Tensor, tokens: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    if tokens == block_ids.numel() * kv.block_size:
        return kv.rows, block_ids
    return kv.token_rows(), token_slots(block_ids, kv.block_size, tokens)


def gather(kv: PagedKV, block_ids: torch.Tensor, tokens: int, out: torch.Tensor) -> None:
    """Copy the blocks of every plane into ``out`` (bytes, ``[planes, tokens, token_bytes]`` in order)."""
    rows, index = _rows_and_index(kv, block_ids, tokens)
    dst = out.view(len(rows), index.numel(), rows[0].shape[1])
    for plane, row in enumerate(rows):
        torch.index_select(row, 0, index, out=dst[plane])


def scatter(kv: PagedKV, chunk: torch.Tensor, block_ids: torch.Tensor, tokens: int) -> None:
    """Copy a chunk (bytes, same layout as ``gather`` writes) into the blocks of every plane."""
    rows, index = _rows_and_index(kv, block_ids, tokens)
    src = chunk.view(len(rows), index.numel(), rows[0].shape[1])
    for plane, row in enumerate(rows):
        row.index_copy_(0, index, src[plane])


def scatter_blocks(kv: PagedKV, chunk: torch.Tensor, block_ids: torch.Tensor, skip: int) -> None:
    """Like ``scatter`` over whole blocks, leaving the chunk's first ``skip`` blocks out."""
    src = chunk.view(len(kv.rows), block_ids.numel(), kv.row_bytes)[:, skip:]
    index = block_ids[skip:]
    for plane, row in enumerate(kv.rows):
        row.index_copy_(0, index, src[plane])
