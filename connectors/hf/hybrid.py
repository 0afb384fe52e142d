"""Hybrid models in transformers (attention layers plus Mamba-2, short-conv or Gated DeltaNet layers).

A prefix of a hybrid model is every attention layer's KV of every token, and each recurrent layer's state
(its conv window, its SSM or delta-rule state) after the prefix's last token: a fixed size whatever the
prefix length, valid only at that exact token. So a chunk (`layout.HybridGeometry`) holds the attention KV of
its tokens in the chunk layout, then every recurrent layer's state after its last token, as one object:
checksummed, tiered and evicted together, so a stored chunk never lacks its state.

The format is found once per model (`hybrid_geometry`) from a one-token forward pass on a throw-away cache:
which layers hold KV (their heads and head size) and which hold states (each state's shape and dtype). It
enters the namespace (`ChunkLayout.state`), so chunks of another state layout never match. These chunks are
transformers' own: the namespace is the model's `hf:` one, never the canonical cross-engine format (vLLM
keeps its hybrid chunks as its own block bytes).

Saves. A cache holds each recurrent state at its last token only, so the states at chunk boundaries exist
only while the prefix is computed: `save_chunks` prefills the prompt's whole chunks not yet stored, one chunk
per forward pass (on the stored prefix where there is one, else on a fresh cache), and stores each chunk as
soon as it is computed. transformers' hybrid layers continue a multi-token forward from the cached conv
window and recurrent state, so this chunk-by-chunk prefill computes the same prefix as one pass (to float
rounding: the scan is split at other places).

Loads. `load_chunks` reads the longest stored run of chunks and builds a fresh cache from the model's config
holding their attention KV and the last chunk's states; the caller prefills the rest on it.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch

from ..common.families import Unsupported
from ..common.layout import HybridGeometry, KVGeometry, StatePart, dense_to_chunks
from ..common.store import ChunkStore
from .forward import cache_kwargs

# Layer types (transformers' `config.layer_types`) that keep a recurrent state.
RECURRENT_TYPES = frozenset({"linear_attention", "conv", "mamba", "hybrid", "hybrid_sliding"})
# Layer types of blocks that cache nothing (transformers gives them a `DummyLayer`).
CACHELESS_TYPES = frozenset({"mlp", "moe", "dummy"})

# model -> ((chunk_tokens, device), its chunk format or why it has none): the probe runs once per model
_GEOMETRIES: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple[int, str], HybridGeometry | Unsupported]]" = (
    weakref.WeakKeyDictionary())


def is_hybrid(config: Any) -> bool:
    """Whether a (text) config's layers include recurrent ones."""
    return any(t in RECURRENT_TYPES for t in getattr(config, "layer_types", None) or ())


def new_hybrid_cache(model: torch.nn.Module) -> Any:
    """A `DynamicCache` laid out from `model`'s config (recurrent layers need their own cache layers), every
    attention layer keeping all its tokens (a sliding layer's window is kept by the model's masks)."""
    from transformers import DynamicCache
    from transformers.cache_utils import (
        DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionAndFullAttentionLayer,
        LinearAttentionAndSlidingWindowAttentionLayer,
    )

    cache = DynamicCache(config=model.config)
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, LinearAttentionAndSlidingWindowAttentionLayer):
            cache.layers[i] = LinearAttentionAndFullAttentionLayer(number_of_states=layer.number_of_states)
        elif isinstance(layer, DynamicSlidingWindowLayer):
            cache.layers[i] = DynamicLayer()
    return cache


def hybrid_geometry(model: torch.nn.Module, chunk_tokens: int, family: str) -> HybridGeometry:
    """The chunk format of `model` (remembered per model and chunk size); raises `Unsupported` for a cache
    whose layers this format does not describe."""
    device = next(model.parameters()).device
    cached = _GEOMETRIES.get(model)
    if cached is None or cached[0] != (chunk_tokens, str(device)):
        try:
            found: HybridGeometry | Unsupported = _probe(model, chunk_tokens, family, device)
        except Unsupported as exc:
            found = exc
        cached = _GEOMETRIES[model] = ((chunk_tokens, str(device)), found)
    if isinstance(cached[1], Unsupported):
        raise cached[1]
    return cached[1]


def _probe(model: torch.nn.Module, chunk_tokens: int, family: str, device: torch.device) -> HybridGeometry:
    """The chunk format, read off a cache after a one-token forward pass."""
    try:
        from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin
    except ImportError as exc:
        raise Unsupported(family, "recurrent layers need transformers 5.x's linear-attention cache layers") from exc
    try:
        cache = new_hybrid_cache(model)
        with torch.no_grad():
            model(torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=True,
                  **cache_kwargs(model, cache))
    except Exception as exc:   # a cache the model does not fill as its config says
        raise Unsupported(family, f"its recurrent layers do not run on a cache laid out from its config "
                                  f"({type(exc).__name__}), so no state can be read") from exc
    attention: list[int] = []
    kv_shapes: set[tuple[int, int, torch.dtype]] = set()
    parts: list[StatePart] = []
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, DynamicLayer) and getattr(layer, "keys", None) is not None:
            if layer.keys.shape != layer.values.shape:
                raise Unsupported(family, "attention layers whose keys and values differ in shape have no "
                                          "hybrid chunk layout")
            attention.append(index)
            kv_shapes.add((layer.keys.shape[1], layer.keys.shape[3], layer.keys.dtype))
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            found = [StatePart(index, kind, s, tuple(tensor.shape[1:]), tensor.dtype)
                     for s in range(layer.number_of_states)
                     for kind, tensor in (("conv", layer.conv_states[s]), ("ssm", layer.recurrent_states[s]))
                     if tensor is not None]
            if not found:
                raise Unsupported(family, f"layer {index} is recurrent in the config but keeps no state in the cache")
            parts.extend(found)
    if len(kv_shapes) != 1 or not parts:
        raise Unsupported(family, "a hybrid chunk needs attention layers of one KV shape and at least one "
                                  f"recurrent state; found KV shapes {sorted(map(str, kv_shapes))} and "
                                  f"{len(parts)} states")
    heads, head_dim, dtype = kv_shapes.pop()
    return HybridGeometry(KVGeometry(len(attention), heads, head_dim, dtype, chunk_tokens), tuple(attention),
                          tuple(parts))


def _state_tensors(cache: Any, geometry: HybridGeometry) -> list[torch.Tensor]:
    """The cache's state tensors, in `geometry.states` order (the cache's own, updated in place)."""
    return [_states(cache.layers[part.layer], part)[part.index] for part in geometry.states]


def _states(layer: Any, part: StatePart) -> dict[int, torch.Tensor]:
    return layer.conv_states if part.kind == "conv" else layer.recurrent_states


def pack_chunk(cache: Any, chunk: int, geometry: HybridGeometry) -> torch.Tensor:
    """Chunk `chunk`'s bytes: its tokens' attention KV from `cache` and the cache's states now (a copy: the
    cache updates them in place), as one uint8 tensor of `geometry.chunk_nbytes`."""
    layers = [cache.layers[i] for i in geometry.attention_layers]
    kv = dense_to_chunks([layer.keys for layer in layers], [layer.values for layer in layers], chunk, 1,
                         geometry.kv)
    pieces = [kv.reshape(-1).view(torch.uint8)]
    for part, tensor in zip(geometry.states, _state_tensors(cache, geometry)):
        if tuple(tensor.shape[1:]) != part.shape or tensor.dtype != part.dtype:
            raise ValueError(f"layer {part.layer} {part.kind}{part.index} is {tuple(tensor.shape)} "
                             f"{tensor.dtype}, the format says {part.label}")
        pieces.append(tensor[0].contiguous().reshape(-1).view(torch.uint8))
    return torch.cat(pieces)


def fill_cache(cache: Any, chunks: Sequence[torch.Tensor], geometry: HybridGeometry, device: torch.device) -> None:
    """Put the attention KV of `chunks` (each `geometry.chunk_nbytes` uint8, in order) and the last chunk's
    states into `cache`, an empty cache from `new_hybrid_cache`."""
    g = geometry.kv
    kv = torch.stack([c[:g.chunk_nbytes].view(g.dtype).view(g.chunk_shape) for c in chunks])
    n = len(chunks) * g.chunk_tokens
    for slot, index in enumerate(geometry.attention_layers):
        k, v = (kv[:, slot, plane].permute(2, 0, 1, 3).reshape(1, g.num_kv_heads, n, g.head_dim).to(device)
                for plane in (0, 1))
        cache.update(k[..., :0, :], v[..., :0, :], index)   # sets the layer up (device, dtype), copies nothing
        cache.layers[index].keys, cache.layers[index].values = k, v
    offset = g.chunk_nbytes
    last = chunks[-1]
    for part in geometry.states:
        # cloned first: a view as another dtype needs its bytes aligned to that dtype
        state = last[offset:offset + part.nbytes].clone().view(part.dtype).view(1, *part.shape).to(device)
        offset += part.nbytes
        layer = cache.layers[part.layer]
        if part.kind == "conv":
            layer.lazy_initialization(conv_states=state, state_idx=part.index, conv_kernel_size=state.shape[-1])
        else:
            layer.lazy_initialization(recurrent_states=state, state_idx=part.index)
        _states(layer, part)[part.index].copy_(state)   # into the cache's own tensor (a static address)
        layer.has_previous_state[part.index] = True
        layer.cumulative_length_linear.fill_(n)


def load_chunks(store: ChunkStore, model: torch.nn.Module, keys: Sequence[bytes], geometry: HybridGeometry,
                device: torch.device) -> tuple[Any, int]:
    """A fresh cache holding the longest stored run of `keys` (attention KV and the last chunk's states), and
    the number of tokens it holds; an empty cache and 0 on a miss."""
    cache = new_hybrid_cache(model)
    if not keys:
        return cache, 0
    with store.lease(keys) as views:   # stops at the first chunk missing or of another size
        chunks = [torch.frombuffer(bytearray(memoryview(v)), dtype=torch.uint8) if not isinstance(v, torch.Tensor)
                  else v.reshape(-1).view(torch.uint8).clone() for v in views]
    if not chunks:
        return cache, 0
    fill_cache(cache, chunks, geometry, device)
    return cache, len(chunks) * geometry.chunk_tokens


@torch.no_grad()
def save_chunks(store: ChunkStore, model: torch.nn.Module, input_ids: torch.Tensor, keys: Sequence[bytes],
                geometry: HybridGeometry) -> int:
    """Compute and store every chunk of `keys` (the whole chunks of `input_ids`) not stored yet, chunk by
    chunk from the stored prefix; returns the number of chunks written (it stops at the first put that fails)."""
    first = store.lookup(keys)
    if first >= len(keys):
        return 0
    cache, n = load_chunks(store, model, keys[:first], geometry, input_ids.device)
    t = geometry.chunk_tokens
    written = 0
    for chunk in range(n // t, len(keys)):
        # Positions given: some models (Bamba in transformers 5.25) number every call's tokens from 0 otherwise
        positions = torch.arange(chunk * t, (chunk + 1) * t, device=input_ids.device)[None]
        model(input_ids[:, chunk * t:(chunk + 1) * t], position_ids=positions, use_cache=True,
              **cache_kwargs(model, cache))
        if store.store(keys, pack_chunk(cache, chunk, geometry)[None], chunk) != 1:
            break
        written += 1
    return written
