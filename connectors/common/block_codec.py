"""vLLM's paged caches read into and written from chunks in the canonical chunk layout
``[layers, 2, tokens, kv_heads, head_dim]`` (``kvstore.connectors.common.layout``): where K and V lie in a
block is the attention backend's, and ``BlockCodec`` knows each one verified."""

from __future__ import annotations

from collections.abc import Sequence

import torch

BLOCK_CONTENTS = ("cpu", "split")


class BlockCodec:
    """vLLM's per-layer caches, logical ``[blocks, kv_heads, block_size, 2 * head_dim]``, read into and written
    from chunks in the chunk layout ``[layers, 2, tokens, kv_heads, head_dim]`` (this rank's heads).

    Where K and V lie in a block is the attention backend's: ``content`` "cpu" (vLLM's CPU backend with its
    ``vec``/``vec16`` kernels: each block's head is ``2 * block_size * head_dim`` values, K transposed,
    ``[head_dim, block_size]``, then V, ``[block_size, head_dim]``; found by writing known K and V through
    ``cpu_attn_reshape_and_cache`` in 0.32) or "split" (the GPU backends of vLLM 0.32, FlashAttention, FlashInfer,
    Triton and Flex, read from their code: ``[..., :head_dim]`` is K, ``[..., head_dim:]`` V, in any physical
    stride order). A chunk's blocks are moved with one ``index_select``
    or ``index_copy_`` per layer and one reordering copy: two passes over the chunk's bytes, against one for a
    chunk of the engine's own block bytes.
    """

    def __init__(self, layers: Sequence[torch.Tensor], content: str) -> None:
        if content not in BLOCK_CONTENTS:
            raise ValueError(f"block content {content!r} is not one of {', '.join(BLOCK_CONTENTS)}")
        first = layers[0]
        if first.dim() != 4 or first.shape[-1] % 2:
            raise ValueError(f"a vLLM layer cache must be [blocks, kv_heads, block_size, 2 * head_dim], got "
                             f"{tuple(first.shape)}")
        if content == "cpu" and not all(t.stride(3) == 1 and t.stride(2) == t.shape[3] for t in layers):
            raise ValueError("the CPU backend's cache must keep each block's head contiguous")
        self.layers = list(layers)
        self.content = content
        self.blocks, self.heads, self.block_size, c = first.shape
        self.head_dim = c // 2
        self.dtype = first.dtype
        self.device = first.device

    def chunk_view(self, raw: torch.Tensor, blocks: int) -> torch.Tensor:
        """Bytes of one chunk of ``blocks`` blocks as ``[layers, 2, tokens, heads, head_dim]``."""
        return raw.reshape(-1).view(torch.uint8).view(self.dtype).view(
            len(self.layers), 2, blocks * self.block_size, self.heads, self.head_dim)

    def save(self, block_ids: Sequence[int], raw: torch.Tensor) -> None:
        """Copy the blocks ``block_ids`` (every one allocated) into the chunk bytes ``raw``."""
        n, out = len(block_ids), self.chunk_view(raw, len(block_ids))
        ids = torch.tensor(list(block_ids), dtype=torch.int64, device=self.device)
        for layer, cache in enumerate(self.layers):
            k, v = self._split(cache.index_select(0, ids))                    # [n, heads, block, dim] each
            out[layer, 0].copy_(k.permute(0, 2, 1, 3).reshape(n * self.block_size, self.heads, self.head_dim))
            out[layer, 1].copy_(v.permute(0, 2, 1, 3).reshape(n * self.block_size, self.heads, self.head_dim))

    def load(self, raw: torch.Tensor, block_ids: Sequence[int]) -> None:
        """Write the chunk bytes ``raw`` into the blocks ``block_ids``; a negative id leaves its block alone."""
        chunk = self.chunk_view(raw, len(block_ids))
        keep = [i for i, b in enumerate(block_ids) if b >= 0]
        if not keep:
            return
        ids = torch.tensor([block_ids[i] for i in keep], dtype=torch.int64, device=self.device)
        pick = torch.tensor(keep, dtype=torch.int64, device=chunk.device)
        for layer, cache in enumerate(self.layers):
            planes = chunk[layer].unflatten(1, (len(block_ids), self.block_size))   # [2, n, block, heads, dim]
            planes = planes.index_select(1, pick).to(self.device, non_blocking=True).permute(0, 1, 3, 2, 4)
            cache.index_copy_(0, ids, self._join(planes[0], planes[1]))

    def _split(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of blocks ``[n, heads, block, 2 * dim]`` as ``[n, heads, block, dim]`` each."""
        if self.content == "cpu":
            n, size = blocks.shape[0], self.block_size * self.head_dim
            kv = blocks.contiguous().view(n, self.heads, 2, size)
            k = kv[:, :, 0].view(n, self.heads, self.head_dim, self.block_size).transpose(-1, -2)
            return k, kv[:, :, 1].view(n, self.heads, self.block_size, self.head_dim)
        return blocks[..., :self.head_dim], blocks[..., self.head_dim:]

    def _join(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Blocks ``[n, heads, block, 2 * dim]`` of K and V ``[n, heads, block, dim]``."""
        if self.content == "cpu":
            n, size = k.shape[0], self.block_size * self.head_dim
            kv = torch.stack((k.transpose(-1, -2).reshape(n, self.heads, size), v.reshape(n, self.heads, size)), 2)
            return kv.view(n, self.heads, self.block_size, 2 * self.head_dim)
        return torch.cat((k, v), dim=-1)
