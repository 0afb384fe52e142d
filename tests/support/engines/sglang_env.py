"""MHA and MLA host pools with SGLang 0.5's page layouts and page methods, and the storage config SGLang builds.

SGLang's own host pool classes need device KV buffers and (through its package imports) torchvision, which
has no build for the CPU torch here; this stand-in keeps what a storage backend touches: `kv_buffer` in each
named layout, `get_data_page`, `get_dummy_flat_data_page`, `set_from_flat_data_page`, and the geometry fields.
"""

from __future__ import annotations

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig


class HostPool:
    def __init__(self, layout: str, layers: int, heads: int, head_dim: int, page_size: int, pages: int,
                 dtype: torch.dtype = torch.float32):
        self.layout, self.layer_num, self.head_num, self.head_dim = layout, layers, heads, head_dim
        self.v_head_dim, self.page_size, self.dtype, self.size = head_dim, page_size, dtype, pages * page_size
        dims = {
            "layer_first": (2, layers, self.size, heads, head_dim),
            "page_first": (2, self.size, layers, heads, head_dim),
            "page_first_direct": (2, pages, layers, page_size, heads, head_dim),
            "page_head": (2, pages, heads, page_size, layers, head_dim),
        }[layout]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    # what a storage backend calls
    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        p, kv = self.page_size, self.kv_buffer
        if self.layout == "layer_first":
            page = kv[:, :, index:index + p]
        elif self.layout == "page_first":
            page = kv[:, index:index + p]
        else:
            page = kv[:, index // p:index // p + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(2, self.layer_num, self.page_size, self.head_num, self.head_dim, dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        page = self.get_data_page(index, flat=False)
        page.copy_(data_page.reshape(page.shape))

    # token access for the tests, one token at a time
    def _token(self, kv: int, layer: int, slot: int) -> torch.Tensor:
        p, buf = self.page_size, self.kv_buffer
        return {
            "layer_first": lambda: buf[kv, layer, slot],
            "page_first": lambda: buf[kv, slot, layer],
            "page_first_direct": lambda: buf[kv, slot // p, layer, slot % p],
            "page_head": lambda: buf[kv, slot // p, :, slot % p, layer],
        }[self.layout]()

    def write_tokens(self, keys, values, slots: list[int]) -> None:
        for layer, (k, v) in enumerate(zip(keys, values)):
            for t, slot in enumerate(slots):
                self._token(0, layer, slot).copy_(k[0, :, t])
                self._token(1, layer, slot).copy_(v[0, :, t])

    def read_tokens(self, slots: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        keys, values = [], []
        for layer in range(self.layer_num):
            keys.append(torch.stack([self._token(0, layer, s) for s in slots], dim=1)[None])
            values.append(torch.stack([self._token(1, layer, s) for s in slots], dim=1)[None])
        return keys, values


class MLAHostPool:
    """`MLATokenToKVPoolHost`'s buffer shapes and page methods: one latent-plus-rope row per token per layer."""

    def __init__(self, layout: str, layers: int, kv_lora_rank: int, rope_dim: int, page_size: int, pages: int,
                 dtype: torch.dtype = torch.float32):
        self.layout, self.layer_num, self.page_size, self.dtype = layout, layers, page_size, dtype
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, rope_dim
        self.kv_cache_dim = kv_lora_rank + rope_dim
        self.size, d = pages * page_size, self.kv_cache_dim
        dims = {
            "layer_first": (layers, self.size, 1, d),
            "page_first": (self.size, layers, 1, d),
            "page_first_direct": (pages, layers, page_size, 1, d),
        }[layout]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        p, kv = self.page_size, self.kv_buffer
        if self.layout == "layer_first":
            page = kv[:, index:index + p]
        elif self.layout == "page_first":
            page = kv[index:index + p]
        else:
            page = kv[index // p:index // p + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.layer_num, self.page_size, 1, self.kv_cache_dim, dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        page = self.get_data_page(index, flat=False)
        page.copy_(data_page.reshape(page.shape))

    def _row(self, layer: int, slot: int) -> torch.Tensor:
        p, buf = self.page_size, self.kv_buffer
        return {
            "layer_first": lambda: buf[layer, slot, 0],
            "page_first": lambda: buf[slot, layer, 0],
            "page_first_direct": lambda: buf[slot // p, layer, slot % p, 0],
        }[self.layout]()

    def write_rows(self, rows: torch.Tensor, slots: list[int]) -> None:
        """`rows` is [layers, tokens, kv_cache_dim]."""
        for layer in range(self.layer_num):
            for t, slot in enumerate(slots):
                self._row(layer, slot).copy_(rows[layer, t])

    def read_rows(self, slots: list[int]) -> torch.Tensor:
        return torch.stack([torch.stack([self._row(layer, s) for s in slots]) for layer in range(self.layer_num)])


PAGE = 16  # the page size of the tests' pools


def slots_of(pages: list[int], page: int = PAGE) -> list[int]:
    """The host slots (token indices) of whole pages, in order."""
    return [p * page + i for p in pages for i in range(page)]


def host_indices(pages: list[int], page: int = PAGE) -> torch.Tensor:
    return torch.tensor(slots_of(pages, page), dtype=torch.int64)


def storage_config(extra: dict, tp_rank: int = 0, tp_size: int = 1, page_first: bool = False,
                   mla: bool = False, pp_rank: int = 0, pp_size: int = 1) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=page_first,
        model_name="tiny-deepseek" if mla else "tiny-llama", extra_config=extra,
    )
