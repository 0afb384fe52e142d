"""HuggingFace transformers connector: load and save prompt prefixes of a transformers cache.

    from kvstore.connectors.hf import load_prefix, save_prefix

    cache, n = load_prefix(client, model, input_ids)     # first n tokens, n a multiple of chunk_tokens
    out = model(input_ids[:, n:], cache=cache, use_cache=True)
    save_prefix(client, model, input_ids, out.cache)

transformers names the forward pass's cache argument and its output's field `cache`; releases before that
rename (4.46 up to the 5.x that made it) call both `past_key_values`, and the rename keeps that name working
with a deprecation warning. Code that must run on releases on either side passes `**cache_kwargs(model, cache)`
and reads `output_cache(out)`; the connector's own forward passes (verification) do the same, so they never
warn.

`input_ids` is a `1 x T` tensor: one sequence. A batch (`B x T`, B > 1) is
refused with `kvstore.UsageError` (call once per row, each row with its own
cache): a cache holds one prefix length, and a batch's rows hit differently.
The chunk size is the client's
`chunk_tokens`; the namespace is derived here from the model (see
`model_namespace`), not taken from the client, so that two models never share
chunks. `load_prefix` leaves at least the last token of `input_ids` to compute,
so the caller always has logits for the next token.

Families (what a chunk holds: `kvstore.connectors.common.families`):

* dense decoders (Llama, Qwen2, Mistral, ...; grouped-query attention included):
  K and V per layer;
* sliding-window and hybrid models (Gemma 2/3, Mistral with a window, gpt-oss,
  Llama 4's chunked layers): the same K and V of every token of every layer;
  the layer kinds are in the namespace. A transformers sliding-window layer
  drops the tokens behind its window, so a cache built from the model config
  cannot give back a prefix's first chunks: `load_prefix` returns (and
  `new_cache` builds) a cache that keeps every token of every layer. The model
  still attends only inside each window (its masks come from the config), so
  the logits are the same; it costs the memory of a full cache. `save_prefix`
  stores the leading chunks every layer still holds and nothing from a cache
  whose layers have dropped the prefix's start.
* MLA (DeepSeek V2/V3, Kimi): transformers caches the normalised latent and
  the roped key per token (`keys` `[b, 1, seq, kv_lora_rank]`, `values`
  `[b, 1, seq, qk_rope_head_dim]`); a chunk holds them side by side as one
  plane, as vLLM's MLA cache does.

* hybrids (attention plus Mamba-2, short-conv or Gated DeltaNet layers: Granite 4, LFM2, Falcon-H1; transformers
  5.x): the attention layers' K and V, then each recurrent layer's state after the chunk's last token, in a
  namespace only this connector reads (`hybrid`). `save_prefix` prefills the unstored chunks itself, one per
  forward pass, to have the states at chunk boundaries (it does not read `cache`); `load_prefix` returns a cache
  built from the config with the chunks' KV and the last chunk's states.

Refused, with one logged line naming the family and the reason (a miss, never
an error): encoder-decoder models, layer types no chunk describes, recurrent
layers that do not fill a cache laid out from the config, and caches of
another kind (quantised, static, offloaded).

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

Shared with vLLM and SGLang. Given `checkpoint=` (the directory the model was
loaded from, unchanged since) a dense model's chunks are the canonical format
every engine reads (`kvstore.connectors.common.canonical`): keyed by the
checkpoint's engine-neutral identity, not by the tensors in memory, so a prefix
vLLM or SGLang saved is a hit here and the other way round. The client must say
hello in the engines' namespace, `canonical_session(MODEL)` (`kv:MODEL`, MODEL
as the engines name it: their model path by default). A PEFT model, or one
changed in place, must not pass `checkpoint`: its KV is not the checkpoint's.

Supported: transformers 4.46 and later (tested with 5.x).
"""

from __future__ import annotations

import logging
import random
import weakref
from typing import Any, cast

import torch
import xxhash

import kvstore

from ..common.families import (
    ChunkLayout,
    Family,
    Unsupported,
    attention_kind,
    mla_layout,
)
from ..common import canonical
from ..common.fingerprint import settings_digest, tensors_fingerprint
from ..common.layout import HybridGeometry, KVGeometry, dense_to_chunks, dtype_name
from ..common.model_identity import checkpoint_identity
from ..common.store import ChunkStore, VerifyResult
from . import hybrid
from .forward import cache_kwargs, output_cache as output_cache   # part of the public API

log = logging.getLogger("kvstore.connectors.hf")

# model -> (its tensors' names, addresses, shapes and dtypes; their fingerprint)
_FINGERPRINTS: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple[Any, ...], str]]" = weakref.WeakKeyDictionary()


def _text_config(model: torch.nn.Module) -> Any:
    config: Any = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def model_layout(model: torch.nn.Module, chunk_tokens: int) -> ChunkLayout:
    """What one chunk of `model`'s cache holds; raises `Unsupported` for a family no chunk describes."""
    config = _text_config(model)
    family = getattr(config, "model_type", "") or type(model).__name__
    if getattr(model.config, "is_encoder_decoder", False):
        raise Unsupported(family, "encoder-decoder caches hold cross attention over the encoder input, "
                                  "not a prompt prefix")
    kinds = _attention_kinds(config, family)
    layers = config.num_hidden_layers
    dtype = cast(torch.dtype, model.dtype)   # a transformers model's property; torch.nn.Module declares none
    if hybrid.is_hybrid(config):
        if getattr(config, "kv_lora_rank", None):
            raise Unsupported(family, "MLA attention beside recurrent layers has no chunk layout")
        g = hybrid.hybrid_geometry(model, chunk_tokens, family)
        return ChunkLayout(Family.DENSE, g.kv, kinds, state=g.label, family_label=family)
    if getattr(config, "kv_lora_rank", None):
        return mla_layout(layers, config.kv_lora_rank, config.qk_rope_head_dim, dtype, chunk_tokens,
                          attention=kinds, family_label=family)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    geometry = KVGeometry(layers, kv_heads, head_dim, dtype, chunk_tokens)
    return ChunkLayout(Family.DENSE, geometry, kinds, family_label=family)


def _attention_kinds(config: Any, family: str) -> tuple[str, ...]:
    """The distinct attention kinds of the model's layers, in layer order (`families.attention_kind`)."""
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False:
        window = None  # Qwen2 and others carry a window they do not use
    types = getattr(config, "layer_types", None) or ["sliding_attention" if window else "full_attention"]
    kinds: list[str] = []
    recurrent = hybrid.is_hybrid(config)
    for t in types:
        if recurrent and t in hybrid.RECURRENT_TYPES and not t.startswith("hybrid"):
            continue   # a recurrent layer: no per-token KV (its state is a hybrid chunk's other part)
        if recurrent and t in hybrid.CACHELESS_TYPES:
            continue   # an MLP or MoE block between a hybrid's layers (Nemotron-H): nothing cached
        if t in ("full_attention", "hybrid"):
            kind = attention_kind()
        elif t in ("sliding_attention", "hybrid_sliding"):
            kind = attention_kind(sliding_window=window)
        elif t == "chunked_attention":
            kind = attention_kind(attention_chunk=getattr(config, "attention_chunk_size", None))
        else:
            raise Unsupported(family, f"layers of type {t!r} have no chunk layout")
        if kind not in kinds:
            kinds.append(kind)
    return tuple(kinds)


def weights_fingerprint(model: torch.nn.Module) -> str:
    """The fingerprint of `model`'s weights and of what else shapes its KV at the same shape: every parameter
    and buffer (``common.fingerprint.tensors_fingerprint``: names, dtypes, shapes and windows of their bytes;
    rotary buffers carry RoPE scaling), the model's config (``common.fingerprint.settings_digest``) and, for a
    PEFT model, which adapters are active, merged or disabled in each adapted layer (`adapter_state`).

    The tensors' part is remembered per model while its tensors are the same objects (an adapter loaded or a
    tensor replaced is seen); after changing weights in place (an optimizer step, a weight sync) call
    `weights_changed`.
    """
    tensors = [*model.named_parameters(), *model.named_buffers()]
    stamp = tuple((name, t.data_ptr(), tuple(t.shape), t.dtype) for name, t in tensors)
    cached = _FINGERPRINTS.get(model)
    if cached is None or cached[0] != stamp:
        with torch.no_grad():
            cached = (stamp, tensors_fingerprint(tensors))
        _FINGERPRINTS[model] = cached
    config = _text_config(model)
    settings = {k: v for k, v in (config.to_dict() if hasattr(config, "to_dict") else {}).items()
                if not k.startswith("_") and k not in ("transformers_version", "name_or_path")}
    return xxhash.xxh3_128_hexdigest(f"{cached[1]}.{settings_digest(settings)}.{adapter_state(model)}".encode())


def weights_changed(model: torch.nn.Module) -> None:
    """Say that `model`'s weights changed in place: its next fingerprint is taken afresh, so chunks saved before
    are never loaded after (nothing is deleted; a model given the same weights elsewhere shares again)."""
    _FINGERPRINTS.pop(model, None)


def adapter_state(model: torch.nn.Module) -> str:
    """Which PEFT adapters shape `model`'s output, per adapted layer ("" for a model without adapters): the
    active ones (none while they are disabled, as inside ``PeftModel.disable_adapter()``) and the merged ones.
    A PEFT model and its base model, or two adapters of one model, never give the same state."""
    layers = []
    for name, module in model.named_modules():
        if not (hasattr(module, "active_adapters") and hasattr(module, "merged_adapters")
                and hasattr(module, "disable_adapters")):
            continue
        active = () if module.disable_adapters else tuple(sorted(_names(module.active_adapters)))
        layers.append(f"{name}:{','.join(active)}:{','.join(sorted(_names(module.merged_adapters)))}")
    return xxhash.xxh3_64_hexdigest("\n".join(layers).encode()) if layers else ""


def _names(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value or ()]


def model_namespace(model: torch.nn.Module, chunk_tokens: int, salt: str = "") -> str:
    """The namespace of `model`'s chunks: name, weights (with adapters and config), dtype and the layout of its
    KV cache."""
    config = _text_config(model)
    name = getattr(model.config, "name_or_path", "") or getattr(config, "model_type", "model")
    revision = getattr(model.config, "_commit_hash", None)
    identity = f"hf:{name}" + (f"@{revision}" if revision else "") + f"#{weights_fingerprint(model)}"
    return model_layout(model, chunk_tokens).namespace(identity, salt=salt)


_REFUSED: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()
_DROPPED: "weakref.WeakKeyDictionary[torch.nn.Module, bool]" = weakref.WeakKeyDictionary()


def _store(client: kvstore.Client, model: torch.nn.Module, salt: str, checkpoint: str | None = None
           ) -> ChunkStore | None:
    try:
        layout = model_layout(model, client.chunk_tokens)
    except Unsupported as exc:
        if model not in _REFUSED:  # once per model
            _REFUSED[model] = exc.line("transformers")
            log.warning(_REFUSED[model])
        return None
    namespace = model_namespace(model, client.chunk_tokens, salt)
    if layout.state:   # a hybrid model's chunks: transformers' own format, never the canonical one
        return ChunkStore(client, namespace, hybrid.hybrid_geometry(model, client.chunk_tokens, layout.family_label))
    if checkpoint is not None and layout.family is Family.DENSE and not adapter_state(model):
        return canonical_store(client, checkpoint, layout.geometry, salt)
    return ChunkStore(client, namespace, layout.geometry)


_IDENTITIES: dict[tuple[str, str], str] = {}


def canonical_store(client: kvstore.Client, checkpoint: str, geometry: KVGeometry, salt: str = ""
                    ) -> canonical.CanonicalStore:
    """Every head of the canonical chunks of the model in `checkpoint` (its identity read once per process)."""
    key = (str(checkpoint), dtype_name(geometry.dtype))
    identity = _IDENTITIES.get(key)
    if identity is None:
        identity = _IDENTITIES[key] = checkpoint_identity(checkpoint, dtype=geometry.dtype)
    g = geometry
    layout = canonical.CanonicalLayout(g.num_layers, g.num_kv_heads, g.head_dim, g.dtype, g.chunk_tokens)
    return canonical.CanonicalStore(client, layout, canonical.identity_root(identity), salt)


def _token_row(input_ids: torch.Tensor) -> torch.Tensor:
    """The one sequence of a `1 x T` `input_ids`. A batch is refused: one cache holds one prefix length, and
    the rows of a batch (padded, each with its own hits) would need one each."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise kvstore.UsageError(f"input_ids must be one sequence, a 1 x T tensor; got {shape}: call "
                                 f"load_prefix and save_prefix once per row, each with its own cache")
    return input_ids[0]


def new_cache(model: torch.nn.Module) -> Any:
    """A `DynamicCache` that keeps every token of every layer, sliding-window layers included.

    The model's masks still limit each sliding layer to its window; keeping the
    rest is what lets `save_prefix` store the prefix's first chunks. A hybrid model's cache is laid out from
    its config (its recurrent layers need their own cache layers: `hybrid.new_hybrid_cache`).
    """
    from transformers import DynamicCache

    if hybrid.is_hybrid(_text_config(model)):
        return hybrid.new_hybrid_cache(model)
    return DynamicCache()


def _cache_layers(cache: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer K and V tensors of a transformers cache, across its releases."""
    if hasattr(cache, "layers"):  # 4.56 and later
        return [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]
    return list(cache.key_cache), list(cache.value_cache)


def _held_from_start(cache: Any, tokens: int) -> int:
    """How many leading tokens every layer of `cache` holds (0 once a layer dropped the prefix's start)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    if layers is None:  # releases before 4.56: every layer is full
        keys, _ = _cache_layers(cache)
        return min([tokens] + [k.shape[-2] for k in keys]) if keys else 0
    held = tokens
    for layer in layers:
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer) or getattr(layer, "keys", None) is None:
            return 0
        if layer.keys.shape[-2] < layer.get_seq_length():
            return 0  # a sliding layer dropped tokens behind its window
        held = min(held, layer.keys.shape[-2])
    return held


def _planes(cache: Any, geometry: KVGeometry) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The cache's per-layer planes in chunk form: K and V, or MLA's latent and rope side by side."""
    keys, values = _cache_layers(cache)
    if geometry.planes == 1:
        return [torch.cat([k, v], dim=-1) for k, v in zip(keys, values)], []
    return keys, values


def load_prefix(
    client: kvstore.Client, model: torch.nn.Module, input_ids: torch.Tensor, *, salt: str = "",
    verify_fraction: float = 0.0, verify_tolerance: tuple[float, float] | None = None,
    checkpoint: str | None = None,
) -> tuple[Any, int]:
    """A `DynamicCache` holding the longest stored prefix of `input_ids`, and its length (for a hybrid model,
    its attention KV and the recurrent states after its last token; `verify_fraction` does not apply there).

    The length is a multiple of `client.chunk_tokens` and leaves at least one
    token of `input_ids` uncached; 0 (and an empty cache) on a miss or when the
    daemon is unavailable. `verify_fraction`: the share of would-be hits that
    are computed and compared with the stored chunks instead (see the module
    docstring); `verify_tolerance`: its (atol, rtol), by default a few ulps of
    the model's dtype. `checkpoint`: the directory the model was loaded from,
    for chunks every engine shares (see the module docstring).
    """
    if not 0.0 <= verify_fraction <= 1.0:
        raise ValueError(f"verify_fraction must be in [0, 1], got {verify_fraction}")
    cache = new_cache(model)
    tokens = _token_row(input_ids)
    store = _store(client, model, salt, checkpoint)
    if store is None:
        return cache, 0
    usable = (len(tokens) - 1) // store.geometry.chunk_tokens
    keys = store.keys(tokens)[:usable]
    hits = store.lookup(keys)
    if hits == 0:
        return cache, 0
    if isinstance(store.geometry, HybridGeometry):
        return hybrid.load_chunks(store, model, keys[:hits], store.geometry, input_ids.device)
    if verify_fraction and random.random() < verify_fraction:
        n = hits * store.geometry.chunk_tokens
        cache, _ = verify_prefix(store, model, input_ids[:, :n], keys[:hits], verify_tolerance)
        return cache, n
    keys_per_layer, values_per_layer = store.load_dense(keys[:hits], device=input_ids.device)
    if not keys_per_layer:
        return cache, 0
    if store.dense.planes == 1:   # MLA: the latent and the roped key, side by side in one plane
        split = _mla_split(model)
        keys_per_layer, values_per_layer = map(list, zip(*(p.split(split, dim=-1) for p in keys_per_layer)))
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


def _mla_split(model: torch.nn.Module) -> list[int]:
    config = _text_config(model)
    return [config.kv_lora_rank, config.qk_rope_head_dim]


@torch.no_grad()
def verify_prefix(store: ChunkStore, model: torch.nn.Module, prefix_ids: torch.Tensor, keys: list[bytes],
                  tolerance: tuple[float, float] | None = None) -> tuple[Any, VerifyResult]:
    """Compute the KV of `prefix_ids` (whole chunks, one per key), compare it with the stored chunks and report
    the comparison; returns the computed cache and the result."""
    cache = new_cache(model)
    model(prefix_ids, use_cache=True, **cache_kwargs(model, cache))
    planes, values = _planes(cache, store.dense)
    computed = dense_to_chunks(planes, values, 0, len(keys), store.dense)
    atol, rtol = tolerance if tolerance is not None else (None, None)
    return cache, store.verify(keys, computed, atol, rtol)


def save_prefix(
    client: kvstore.Client,
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    cache: Any,
    *,
    salt: str = "",
    checkpoint: str | None = None,
) -> int:
    """Store every full chunk of `input_ids` held by `cache` and not stored yet.

    `cache` must hold the KV of `input_ids` from position 0 (it may hold more
    tokens, such as generated ones, which are ignored). A hybrid model's `cache`
    is not read (it may be None): its states exist at its last token only, so
    the chunks not stored yet are prefilled here, one per forward pass, from the
    stored prefix (`hybrid.save_chunks`). Returns the number of chunks written;
    0 when the daemon is unavailable.
    """
    tokens = _token_row(input_ids)
    store = _store(client, model, salt, checkpoint)
    if store is None:
        return 0
    if isinstance(store.geometry, HybridGeometry):
        keys = store.keys(tokens)[: len(tokens) // store.geometry.chunk_tokens]
        return hybrid.save_chunks(store, model, input_ids, keys, store.geometry)
    held = _held_from_start(cache, len(tokens))
    if held == 0 and len(tokens) >= store.geometry.chunk_tokens and model not in _DROPPED:
        _DROPPED[model] = True
        log.warning("kvstore: the cache of %s no longer holds the prompt's first tokens (a sliding-window layer "
                    "drops them), so nothing is saved; prefill with kvstore.connectors.hf.new_cache(model)",
                    type(model).__name__)
    keys = store.keys(tokens)[: held // store.geometry.chunk_tokens]
    first = store.lookup(keys)
    if first >= len(keys):
        return 0
    planes, values = _planes(cache, store.dense)
    chunks = dense_to_chunks(planes, values, first, len(keys) - first, store.dense)
    return store.store(keys, chunks, first)
