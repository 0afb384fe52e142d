"""HuggingFace transformers connector: load and save prompt prefixes of a `DynamicCache`.

    from kvstore.connectors.hf import load_prefix, save_prefix

    cache, n = load_prefix(client, model, input_ids)     # first n tokens, n a multiple of chunk_tokens
    out = model(input_ids[:, n:], past_key_values=cache, use_cache=True)
    save_prefix(client, model, input_ids, out.past_key_values)

`input_ids` is a `1 x T` tensor. The chunk size is the client's
`chunk_tokens`; the namespace is derived here from the model (see
`model_namespace`), not taken from the client, so that two models never share
chunks. `load_prefix` leaves at least the last token of `input_ids` to compute,
so the caller always has logits for the next token.

Online verification. With `verify_fraction=f`, that share of the calls that
would hit compute the prefix instead of loading it (one prefill of the hit
tokens), compare the computed KV with the stored chunks (`ChunkStore.verify`:
within a few ulps of the dtype) and report the comparison to the daemon, which
counts it and drops a chain that differs. The computed cache is returned, so
the caller's output is plain prefill's whatever the store holds. Cost: the
prefill the hit would have saved, on that share of hits (`bench/verify.py`).
The default is 0: a cache that is always recomputed saves nothing, and the
daemon's checksums already catch damage after commit; a fraction such as 0.01
catches what checksums cannot (wrong bytes written at put, a layout change)
at 1 % of the saving.

Supported: transformers 4.46 and later (tested with 5.x), decoder models whose
every layer is full attention with a per-token K and V of
`[kv_heads, head_dim]` (Llama, Mistral without a sliding window, Qwen2, ...,
grouped-query attention included). Sliding-window, hybrid and quantized caches
are reported as misses and never saved.
"""

from __future__ import annotations

import inspect
import logging
import random
import weakref
from typing import Any

import torch
import xxhash

import kvstore

from ._store import ChunkStore, VerifyResult
from .layout import KVGeometry, dense_to_chunks, namespace

log = logging.getLogger("kvstore.connectors.hf")

_FINGERPRINTS: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()


def _text_config(model: torch.nn.Module) -> Any:
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def model_geometry(model: torch.nn.Module, chunk_tokens: int) -> KVGeometry:
    """Layers, kv heads, head dim and dtype of `model`'s KV cache."""
    config = _text_config(model)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return KVGeometry(config.num_hidden_layers, kv_heads, head_dim, model.dtype, chunk_tokens)


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A cheap digest of a sample of every parameter (first and last 8 values).

    Tells apart models that share a name or config but not weights (a
    fine-tune, or random weights built from a config). Computed once a model.
    """
    cached = _FINGERPRINTS.get(model)
    if cached is not None:
        return cached
    samples = []
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            flat = p.detach().reshape(-1)
            samples.append(torch.cat([flat[:8], flat[-8:]]).float())
    blob = torch.cat(samples).cpu().numpy().tobytes() if samples else b""
    digest = xxhash.xxh3_64_hexdigest(blob)
    _FINGERPRINTS[model] = digest
    return digest


def model_namespace(model: torch.nn.Module, chunk_tokens: int, salt: str = "") -> str:
    """The namespace of `model`'s chunks: name, weights, dtype and KV shape."""
    config = _text_config(model)
    name = getattr(model.config, "name_or_path", "") or getattr(config, "model_type", "model")
    revision = getattr(model.config, "_commit_hash", None)
    identity = f"hf:{name}" + (f"@{revision}" if revision else "") + f"#{weights_fingerprint(model)}"
    return namespace(identity, model_geometry(model, chunk_tokens), salt=salt)


def _supported(model: torch.nn.Module) -> bool:
    """Whether every layer of the model's cache keeps the full K and V of every token."""
    from transformers import DynamicCache

    cache = _new_cache(model)
    if hasattr(cache, "layers") and cache.layers:  # releases that build layers from the config
        from transformers.cache_utils import DynamicLayer

        return all(type(layer) is DynamicLayer for layer in cache.layers)
    config = _text_config(model)
    layer_types = getattr(config, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        return False
    return not getattr(config, "sliding_window", None) and isinstance(cache, DynamicCache)


def _store(client: kvstore.Client, model: torch.nn.Module, salt: str) -> ChunkStore | None:
    if not _supported(model):
        log.warning("model %s has non-full-attention layers; kvstore is not used", type(model).__name__)
        return None
    chunk_tokens = client.chunk_tokens
    geometry = model_geometry(model, chunk_tokens)
    return ChunkStore(client, model_namespace(model, chunk_tokens, salt), geometry)


def _token_row(input_ids: torch.Tensor) -> torch.Tensor:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be 1 x T, got shape {tuple(input_ids.shape)}")
    return input_ids[0]


def _new_cache(model: torch.nn.Module) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # transformers < 4.56 takes no config
        return DynamicCache()


def _cache_layers(cache: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer K and V tensors of a transformers cache, across its releases."""
    if hasattr(cache, "layers"):  # 4.56 and later
        return [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]
    return list(cache.key_cache), list(cache.value_cache)


def load_prefix(
    client: kvstore.Client, model: torch.nn.Module, input_ids: torch.Tensor, *, salt: str = "",
    verify_fraction: float = 0.0, verify_tolerance: tuple[float, float] | None = None,
) -> tuple[Any, int]:
    """A `DynamicCache` holding the longest stored prefix of `input_ids`, and its length.

    The length is a multiple of `client.chunk_tokens` and leaves at least one
    token of `input_ids` uncached; 0 (and an empty cache) on a miss or when the
    daemon is unavailable. `verify_fraction`: the share of would-be hits that
    are computed and compared with the stored chunks instead (see the module
    docstring); `verify_tolerance`: its (atol, rtol), by default a few ulps of
    the model's dtype.
    """
    if not 0.0 <= verify_fraction <= 1.0:
        raise ValueError(f"verify_fraction must be in [0, 1], got {verify_fraction}")
    cache = _new_cache(model)
    tokens = _token_row(input_ids)
    store = _store(client, model, salt)
    if store is None:
        return cache, 0
    usable = (len(tokens) - 1) // store.geometry.chunk_tokens
    keys = store.keys(tokens)[:usable]
    hits = store.lookup(keys)
    if hits == 0:
        return cache, 0
    if verify_fraction and random.random() < verify_fraction:
        n = hits * store.geometry.chunk_tokens
        cache, _ = verify_prefix(store, model, input_ids[:, :n], keys[:hits], verify_tolerance)
        return cache, n
    keys_per_layer, values_per_layer = store.load_dense(keys[:hits], device=input_ids.device)
    if not keys_per_layer:
        return cache, 0
    _fill_cache(cache, keys_per_layer, values_per_layer)
    return cache, keys_per_layer[0].shape[-2]


def _fill_cache(cache: Any, keys_per_layer: list[torch.Tensor], values_per_layer: list[torch.Tensor]) -> None:
    """Put loaded K and V into an empty cache. Releases with per-layer objects (4.56 and later) take the tensors
    as they are: ``update`` would copy each once more (a concatenation onto an empty tensor)."""
    for layer, (k, v) in enumerate(zip(keys_per_layer, values_per_layer)):
        if hasattr(cache, "layers"):
            cache.update(k[..., :0, :], v[..., :0, :], layer)   # sets the layer up (device, dtype), copies nothing
            cache.layers[layer].keys, cache.layers[layer].values = k, v
        else:
            cache.update(k, v, layer)


@torch.no_grad()
def verify_prefix(store: ChunkStore, model: torch.nn.Module, prefix_ids: torch.Tensor, keys: list[bytes],
                  tolerance: tuple[float, float] | None = None) -> tuple[Any, VerifyResult]:
    """Compute the KV of `prefix_ids` (whole chunks, one per key), compare it with the stored chunks and report
    the comparison; returns the computed cache and the result."""
    cache = _new_cache(model)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    model(prefix_ids, use_cache=True, **{name: cache})
    keys_per_layer, values_per_layer = _cache_layers(cache)
    computed = dense_to_chunks(keys_per_layer, values_per_layer, 0, len(keys), store.geometry)
    atol, rtol = tolerance if tolerance is not None else (None, None)
    return cache, store.verify(keys, computed, atol, rtol)


def save_prefix(
    client: kvstore.Client,
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    cache: Any,
    *,
    salt: str = "",
) -> int:
    """Store every full chunk of `input_ids` held by `cache` and not stored yet.

    `cache` must hold the KV of `input_ids` from position 0 (it may hold more
    tokens, such as generated ones, which are ignored). Returns the number of
    chunks written; 0 when the daemon is unavailable.
    """
    tokens = _token_row(input_ids)
    store = _store(client, model, salt)
    if store is None:
        return 0
    keys_per_layer, values_per_layer = _cache_layers(cache)
    held = min(len(tokens), keys_per_layer[0].shape[-2]) if keys_per_layer else 0
    keys = store.keys(tokens)[: held // store.geometry.chunk_tokens]
    first = store.lookup(keys)
    if first >= len(keys):
        return 0
    chunks = dense_to_chunks(keys_per_layer, values_per_layer, first, len(keys) - first, store.geometry)
    return store.store(keys, chunks, first)
