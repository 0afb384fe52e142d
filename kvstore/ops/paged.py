"""Gather and scatter between an engine's paged KV cache and the contiguous chunk layout.

An engine keeps its KV cache in fixed-size blocks (pages) scattered over per-layer tensors; the store keeps a
chunk as one contiguous object. Moving a chunk is therefore a gather (blocks → chunk, on save) or a scatter
(chunk → blocks, on load) over *every* layer at once, and it is the hot path of every connector.

Model. A paged cache is a list of **planes**: 2-D byte tensors ``[num_blocks, row_bytes]`` in which row ``b``
holds block ``b`` (``block_size`` tokens) of one plane. Only each row must be one run of memory; the row stride
may be larger (vLLM's FlashInfer layout interleaves K and V per block). The chunk layout is
``[planes, blocks, row_bytes]``: plane-major, which lets a connector hand over one layer while the next is
still in flight. Two kinds of planes:

* **token-major** planes, whose rows are ``block_size`` runs of ``token_bytes`` (one token's K, or V, or
  latent): a chunk of them is ``[planes, tokens, token_bytes]``, the same bytes whichever engine wrote them, and
  a chunk may end inside a block (``num_tokens``). ``from_vllm`` and ``from_kv_pairs`` build these:

  vLLM FlashAttention, per layer ``[2, num_blocks, block_size, kv_heads, head_dim]``  → planes ``t[0]``, ``t[1]``
  vLLM FlashInfer,     per layer ``[num_blocks, 2, block_size, kv_heads, head_dim]``  → planes ``t[:, 0]``, ``t[:, 1]``
  separate K and V,    per layer ``[num_blocks, block_size, kv_heads, head_dim]``     → planes ``k``, ``v``
  one latent per layer (MLA), ``[num_blocks, block_size, latent_dim]``              → ``PagedKV(latents, block_size)``
  token-indexed pools (SGLang ``[slots, kv_heads, head_dim]``) are planes with ``block_size == 1``.

* **block** planes (``from_blocks``), whose rows are a block's bytes exactly as the engine stores them, in
  whatever order the attention backend keeps heads, tokens and K/V inside a block (vLLM 0.32+: one tensor per
  layer, logical ``[num_blocks, kv_heads, block_size, content]``, any physical stride order). Copying whole
  blocks is one ``memcpy`` per block and plane and needs no knowledge of the backend; the price is that the
  bytes depend on the engine's cache format, so a connector names that format in its namespace, and chunks
  always cover whole blocks.

A chunk covers ``len(block_ids)`` whole blocks. When its last block is only partly used (a short final chunk),
``num_tokens`` says how many tokens count, and the copy goes token by token so that the rest of that block is
neither read into the chunk nor overwritten.

Cost: one pass over the chunk's bytes, in ``row_bytes`` pieces (``block_size × kv_heads × head_dim × dtype``
bytes: 32 KiB for Llama-3-8B with 16-token blocks), so the copy runs at memory bandwidth. Which kernel does the
copy (torch indexing, the native C or CUDA kernel) is chosen by ``kvstore.ops.registry``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


def _is_dense(t: torch.Tensor) -> bool:
    """Whether ``t`` covers one gap-free run of memory, in some order of its axes."""
    expected = 1
    dims = sorted(((st, s) for s, st in zip(t.shape, t.stride()) if s != 1))
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _byte_rows(t: torch.Tensor) -> torch.Tensor:
    """View ``t`` (blocks on axis 0, each block one run of memory) as ``[num_blocks, row_bytes]`` bytes."""
    size = t.element_size()
    row_bytes = t[0].numel() * size
    storage = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    return storage.as_strided((t.shape[0], row_bytes), (t.stride(0) * size, 1), t.storage_offset() * size)


def _as_rows(t: torch.Tensor, block_size: int) -> torch.Tensor:
    """A token-major plane ``[num_blocks, block_size, ...]`` (each block contiguous) as byte rows."""
    if t.dim() < 2 or t.shape[1] != block_size:
        raise ValueError(f"a cache plane must be [num_blocks, block_size={block_size}, ...], got {tuple(t.shape)}")
    if not t[0].is_contiguous():
        raise ValueError("each block of a cache plane must be contiguous in memory")
    return _byte_rows(t)


def _block_planes(layer: torch.Tensor) -> list[torch.Tensor]:
    """A layer's cache as planes whose blocks are single runs of memory: the layer itself when each block is,
    else its slices along axis 1 (e.g. heads kept outside the block axis), recursively."""
    if layer.dim() < 2:
        raise ValueError(f"a paged cache layer must be [num_blocks, ...], got {tuple(layer.shape)}")
    if _is_dense(layer[0]):
        return [layer]
    if layer.dim() < 3:
        raise ValueError(f"no axis split makes the blocks of a {tuple(layer.shape)} cache contiguous")
    return [p for i in range(layer.shape[1]) for p in _block_planes(layer[:, i])]


@dataclass(frozen=True)
class ChunkShape:
    """What one chunk of a given cache looks like as bytes."""

    planes: int          # 2 × layers
    tokens: int          # tokens the chunk covers
    token_bytes: int     # bytes of one token in one plane (kv_heads × head_dim × dtype)

    @property
    def nbytes(self) -> int:
        return self.planes * self.tokens * self.token_bytes


class PagedKV:
    """An engine's paged KV cache, as planes of byte rows, with gather and scatter over all of them at once."""

    def __init__(self, planes: Sequence[torch.Tensor], block_size: int, token_major: bool = True) -> None:
        if not planes:
            raise ValueError("a paged cache needs at least one plane")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        first = planes[0]
        for p in planes:
            if p.shape != first.shape or p.dtype != first.dtype or p.device != first.device:
                raise ValueError("every cache plane must have the same shape, dtype and device; got "
                                 f"{tuple(p.shape)}/{p.dtype}/{p.device} next to "
                                 f"{tuple(first.shape)}/{first.dtype}/{first.device}")
        self.block_size = block_size
        self.token_major = token_major  # rows are block_size runs of one token each (see the module docstring)
        self.dtype = first.dtype
        self.device = first.device
        self.num_blocks = first.shape[0]
        self.rows = [_as_rows(p, block_size) if token_major else _byte_rows(p) for p in planes]
        self.row_bytes = self.rows[0].shape[1]
        self.token_bytes = self.row_bytes // block_size
        self.row_stride = self.rows[0].stride(0)
        self.uniform_stride = all(r.stride(0) == self.row_stride for r in self.rows)
        self.kernel_state: object | None = None  # what the native kernels keep per cache (kvstore/native/copy.py)

    # -- constructors for the layouts engines use ----------------------------------------------------------
    @classmethod
    def from_vllm(cls, kv_caches: Sequence[torch.Tensor]) -> "PagedKV":
        """vLLM per-layer caches: ``[2, num_blocks, block_size, kv_heads, head_dim]`` (FlashAttention) or
        ``[num_blocks, 2, block_size, kv_heads, head_dim]`` (FlashInfer)."""
        planes: list[torch.Tensor] = []
        block_size = 0
        for layer in kv_caches:
            if layer.dim() != 5 or 2 not in (layer.shape[0], layer.shape[1]):
                raise ValueError(f"a vLLM layer cache must be 5-D with a K/V dimension of 2, got {tuple(layer.shape)}")
            kv_first = layer.shape[0] == 2
            block_size = layer.shape[2]
            planes += [layer[0], layer[1]] if kv_first else [layer[:, 0], layer[:, 1]]
        return cls(planes, block_size)

    @classmethod
    def from_blocks(cls, layers: Sequence[torch.Tensor], block_size: int) -> "PagedKV":
        """Per-layer caches indexed by block on axis 0, copied as the engine stores each block (block planes:
        chunks of whole blocks only). vLLM 0.32+ hands out ``[num_blocks, kv_heads, block_size, content]``."""
        if not layers:
            raise ValueError("a paged cache needs at least one layer")
        return cls([p for layer in layers for p in _block_planes(layer)], block_size, token_major=False)

    @classmethod
    def from_kv_pairs(cls, k_caches: Sequence[torch.Tensor], v_caches: Sequence[torch.Tensor]) -> "PagedKV":
        """Separate K and V tensors per layer, each ``[num_blocks, block_size, ...]`` (``[slots, ...]`` with
        a block size of 1 for token-indexed pools)."""
        if len(k_caches) != len(v_caches):
            raise ValueError(f"{len(k_caches)} K caches but {len(v_caches)} V caches")
        first = k_caches[0]
        if first.dim() == 3:  # token-indexed: [slots, heads, dim]
            planes = [t.unsqueeze(1) for pair in zip(k_caches, v_caches) for t in pair]
            return cls(planes, 1)
        return cls([t for pair in zip(k_caches, v_caches) for t in pair], first.shape[1])

    # -- shapes -------------------------------------------------------------------------------------------
    def chunk_shape(self, num_tokens: int) -> ChunkShape:
        return ChunkShape(len(self.rows), num_tokens, self.token_bytes)

    def check_blocks(self, block_ids: torch.Tensor, num_tokens: int | None) -> int:
        """Validate a request; returns the token count (all of the blocks' tokens when ``num_tokens`` is None)."""
        if block_ids.dim() != 1 or block_ids.dtype != torch.int64:
            raise ValueError("block_ids must be a 1-D int64 tensor")
        full = block_ids.numel() * self.block_size
        tokens = full if num_tokens is None else num_tokens
        if not full - self.block_size < tokens <= full:
            raise ValueError(f"{tokens} tokens do not fill the last of {block_ids.numel()} blocks of "
                             f"{self.block_size} tokens")
        if tokens != full and not self.token_major:
            raise ValueError("a chunk of block planes covers whole blocks; "
                             f"{tokens} tokens end inside a block of {self.block_size}")
        return tokens

    def token_rows(self) -> list[torch.Tensor]:
        """The planes viewed token by token: ``[num_blocks * block_size, token_bytes]`` (for partial blocks of
        token-major planes)."""
        return [r.unflatten(1, (self.block_size, self.token_bytes)).flatten(0, 1) for r in self.rows]


def block_ids_tensor(block_ids: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Block ids as the int64 tensor the kernels take, on the cache's device."""
    if isinstance(block_ids, torch.Tensor):
        return block_ids.to(device=device, dtype=torch.int64)
    return torch.tensor(list(block_ids), dtype=torch.int64, device=device)


def token_slots(block_ids: torch.Tensor, block_size: int, num_tokens: int) -> torch.Tensor:
    """Token slot numbers ``block * block_size + i`` of the first ``num_tokens`` tokens of the blocks."""
    offsets = torch.arange(block_size, device=block_ids.device, dtype=torch.int64)
    return (block_ids[:, None] * block_size + offsets).reshape(-1)[:num_tokens]
