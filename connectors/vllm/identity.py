"""Everything beyond a request's token ids that shapes its KV, as the vLLM connector folds it into chunk keys.

A chunk's key is ``H(key_{i-1} ‖ tokens_i ‖ extras_i)`` from a root of the namespace and the request's key root
(``kvstore/keys.py``). Here both are made:

- **the key root** (`RequestKeys.root`): the request's ``cache_salt``, the model's identity (`model_identity`:
  a fingerprint of the checkpoint's weights and a digest of the settings that change KV values at the same
  shape), the weights epoch (`WeightsEpoch`: moved by ``reset_cache()``, or the weights version a request
  names) and the LoRA adapter's content fingerprint (`AdapterFingerprints`);
- **each chunk's extras** (`RequestKeys.extras`): what vLLM's own ``generate_block_hash_extra_keys`` folds into
  the blocks of the chunk's token range (the hashes of the images, audio and video whose placeholders the
  chunk holds, with their offsets; the hash of its prompt embeddings), encoded canonically and hashed to 16
  bytes. vLLM's own function is called so that what kvstore keys never drifts from what vLLM's prefix cache
  keys; its LoRA entry (the adapter's name and path) is replaced by the adapter's content fingerprint and its
  cache salt entry is left to the root.

A request with an input this module cannot key (a modality other than image, audio and video, a multimodal
input without a hash, an extra key vLLM makes of a type it cannot encode, an adapter whose files cannot be
read, an identity field vLLM added that is not known here) is refused: `Unkeyable`, which the scheduler counts
and answers by neither loading nor saving the request.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import xxhash

from kvstore.errors import ConfigError

from ..common.canonical import identity_root, request_root
from ..common.model_identity import checkpoint_config
from ..common.model_identity import model_identity as common_identity
from ..common.model_identity import model_settings as common_settings
from ..common.keying import AdapterFingerprints, RequestKeys, Unkeyable, WeightsEpoch, encode

__all__ = ["AdapterFingerprints", "RequestKeys", "Unkeyable", "WeightsEpoch", "extend", "model_identity",
           "request_keys"]

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request

log = logging.getLogger("kvstore.connectors")

MODALITIES = frozenset({"image", "audio", "video"})
# vLLM's tags in its extra keys that kvstore takes from elsewhere: the adapter (by content, in the root) and the
# cache salt (in the root, as before extras were keyed).
REPLACED_TAGS = frozenset({"lora", "cache_salt"})
# The request fields of the supported vLLM versions; a field outside them whose name says it may change the
# KV (below) and which is set marks a request this connector cannot key.
KNOWN_FIELDS = frozenset({
    "_all_token_ids", "_block_hasher", "_output_token_ids", "_prompt_embeds_per_block_hashes",
    "abort_immediately", "all_token_ids", "arrival_time", "block_hashes", "cache_salt", "client_index",
    "drop_stale_output", "ec_transfer_params", "events", "is_prefill_chunk", "kv_cache_report_mode", "kv_hints",
    "kv_transfer_params", "last_sched_seq", "lora_request", "max_tokens", "mm_features", "next_decode_eligible_step",
    "num_computed_tokens", "num_in_flight_tokens", "num_nans_in_logits", "num_output_placeholders",
    "num_preemptions", "num_prompt_tokens", "num_stale_output_tokens", "output_token_ids", "pooling_params",
    "prefill_stats", "priority", "prompt_embeds", "prompt_is_token_ids", "prompt_token_ids", "replay_start",
    "request_id", "resumable", "sampling_params", "session_id", "shared_prefix_boundary",
    "skip_reading_prefix_cache", "spec_decode_metrics", "spec_token_ids", "status", "stop_reason",
    "streaming_queue", "structured_output_request", "trace_headers",
})
IDENTITY_HINTS = ("embed", "lora", "adapter", "multimodal", "mm_", "image", "audio", "video", "steer", "salt")


def request_keys(request: "Request", chunk_tokens: int, chunks: int, model: str, epoch: WeightsEpoch,
                 adapters: AdapterFingerprints) -> RequestKeys:
    """The key root and the extras of the first `chunks` chunks of `request`.

    Raises:
        Unkeyable: the request holds an input this connector cannot key.
    """
    _check_fields(request)
    for feature in getattr(request, "mm_features", None) or ():
        modality = getattr(feature, "modality", None)
        if modality not in MODALITIES:
            raise Unkeyable("modality", f"multimodal input of modality {modality!r} (keyed: "
                                        f"{', '.join(sorted(MODALITIES))})")
        if not getattr(feature, "identifier", None):
            raise Unkeyable("mm_hash", f"a {modality} input without a hash")
    lora = getattr(request, "lora_request", None)
    adapter = adapters.of(lora) if lora else ""
    root = request_root(getattr(request, "cache_salt", None), identity_root(model, epoch.of(request), adapter))
    keys = RequestKeys(root)
    extend(keys, request, chunk_tokens, chunks)
    return keys


def extend(keys: RequestKeys, request: "Request", chunk_tokens: int, chunks: int) -> None:
    """Make the extras of `request`'s chunks up to `chunks` (vLLM's extra keys of each chunk's token range).

    Raises:
        Unkeyable: vLLM's extra keys hold a value this module cannot encode.
    """
    if len(keys.extras) >= chunks:
        return
    if not (getattr(request, "mm_features", None) or getattr(request, "prompt_embeds", None) is not None):
        keys.extras.extend([b""] * (chunks - len(keys.extras)))   # nothing vLLM keys per block: no call
        return
    from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys

    for i in range(len(keys.extras), chunks):
        try:
            found, keys.next_mm = generate_block_hash_extra_keys(request, i * chunk_tokens, (i + 1) * chunk_tokens,
                                                                 keys.next_mm)
        except (AssertionError, AttributeError, TypeError, ValueError) as exc:
            raise Unkeyable("extra_keys", f"vLLM's extra keys of chunk {i}: {exc}") from None
        kept = [k for k in found or () if not (isinstance(k, tuple) and k and k[0] in REPLACED_TAGS)]
        keys.extras.append(xxhash.xxh3_128_digest(encode(tuple(kept))) if kept else b"")


def _check_fields(request: "Request") -> None:
    """Refuse a request carrying a set field this connector does not know and whose name says it may shape
    the KV (a vLLM newer than the ones this connector was written for)."""
    for name, value in vars(request).items():
        if name in KNOWN_FIELDS or not any(hint in name.lower() for hint in IDENTITY_HINTS):
            continue
        if value is not None and value is not False and not (hasattr(value, "__len__") and len(value) == 0):
            raise Unkeyable("field", f"request field {name!r} is set and not keyed by this connector")


# -- the model ---------------------------------------------------------------------------------------------


def model_identity(vllm_config: "VllmConfig", mode: str) -> str:
    """The model's identity in the key root (``common/model_identity.py``, the same for every engine that loads
    the same weights with the same settings): the weights' fingerprint (``mode`` "sampled" or "full"; "off": the
    model's name stands for its weights) and a digest of every setting that changes KV at the same shape.

    Raises:
        ConfigError: the checkpoint cannot be read for its fingerprint.
    """
    model = getattr(vllm_config, "model_config", None)
    if model is None:
        return "no-model"   # a config without a model (vLLM's own unit harnesses): nothing to fingerprint
    path = checkpoint_path(model) if mode != "off" or os.path.exists(str(model.model)) else None
    return common_identity(path, model_settings(vllm_config, path), mode)


def checkpoint_path(model: Any) -> str:
    """The local directory of the model's weights: the path vLLM was given, or the hub's local snapshot."""
    path = str(model.model)
    if os.path.exists(path):
        return path
    try:
        from huggingface_hub import snapshot_download

        return str(snapshot_download(path, revision=getattr(model, "revision", None), local_files_only=True))
    except Exception as exc:  # noqa: BLE001 - any failure to find it is the same answer
        raise ConfigError(f"kvstore: cannot find the weights of {path!r} on this host for the weights "
                          f"fingerprint ({exc}); set kv_connector_extra_config fingerprint \"off\" and a "
                          f"model_id that names these weights exactly") from None


def model_settings(vllm_config: "VllmConfig", path: str | None = None) -> dict[str, Any]:
    """Every setting of the engine that changes KV values at the same shape and dtype, as every engine writes it
    (``common/model_identity.py``): the checkpoint's config with ``hf_overrides`` merged in (RoPE scaling and
    theta), the dtype, quantization, the KV cache dtype and whether its scales are computed, and the load format
    (with the seed for random weights). Overrides given as a function cannot be merged into the checkpoint's
    config: vLLM's parsed config and the function's name stand for them (no other engine shares that)."""
    model = vllm_config.model_config
    cache = vllm_config.cache_config
    overrides = getattr(model, "hf_overrides", None)
    if callable(overrides):
        hf = getattr(model, "hf_config", None)
        config = {"parsed": hf.to_dict() if hf is not None and hasattr(hf, "to_dict") else {},
                  "hf_overrides": getattr(overrides, "__qualname__", None)}
    else:
        config = checkpoint_config(path, overrides if isinstance(overrides, dict) else None)
    load = getattr(getattr(vllm_config, "load_config", None), "load_format", None)
    return common_settings(
        config=config, dtype=getattr(model, "dtype", ""), quantization=getattr(model, "quantization", None),
        kv_cache_dtype=getattr(cache, "cache_dtype", None),
        kv_scales="computed" if getattr(cache, "calculate_kv_scales", False) else None,
        load_format=str(load) if load is not None else None, seed=getattr(model, "seed", None), engine="vllm")
