"""A model's identity in chunk keys, whatever the engine: the weights' fingerprint and a digest of the settings
that change KV values at the same shape, each setting written one way for every engine.

An engine's connector reads its own config and calls `model_settings` with what it found; `model_identity`
turns a checkpoint directory and those settings into the identity folded into every key root. Two engines that
load the same weight bytes with the same settings get the same identity on any host, so a remote tier shared by
hosts (and, with engine-neutral chunk bytes, engines of another kind) still shares; a rewritten checkpoint, a
dtype, a quantization, a RoPE override or a KV cache dtype of its own gives another.

The settings, normalized:

- ``config``: the checkpoint's own ``config.json`` with the engine's overrides merged in (`checkpoint_config`:
  RoPE scaling and theta among them), without what differs between hosts of one model (its local path, the
  library's version, private fields). Not the engine's parsed config: each engine adds fields of its own to it
  (SGLang's ``context_len`` and ``v_head_dim``, its own spelling of ``rope_parameters``), so two engines' parsed
  configs of one checkpoint differ;
- ``dtype``: the weights' compute dtype, as torch names it without ``torch.`` (``float32``, ``bfloat16``; the
  engines' aliases ``half``, ``bf16``... written so too, and ``auto`` as the config's own ``torch_dtype``);
- ``quantization``: the weight quantization method's name, lower case, or None (also for ``none`` and ``auto``);
- ``kv_cache_dtype``: the dtype the KV cache is kept in, ``auto`` written as the model's dtype and ``fp8``
  as ``fp8_e4m3`` (the engines' alias);
- ``kv_scales``: how KV scales are found: None (none), ``"computed"`` or the digest of the file that holds them;
- ``load_format``: None for formats that load the checkpoint's values as they are; otherwise its name (``dummy``
  weights, which are random and not fingerprinted, with their ``seed`` and the ``engine`` that drew them: two
  engines' random weights from one seed are not the same weights).

`checkpoint_identity` is the identity of a checkpoint directory loaded as it is (what the transformers connector
computes, and what vLLM's and SGLang's connectors compute for the same checkpoint at their defaults).
"""

from __future__ import annotations

import json
import os
from typing import Any

import xxhash

from kvstore.errors import ConfigError

from .fingerprint import settings_digest, weights_fingerprint

__all__ = ["checkpoint_config", "checkpoint_identity", "model_identity", "model_settings", "portable_config"]

# Load formats that put the checkpoint's own values in the model (others quantize, or make random weights).
VALUE_PRESERVING_LOAD_FORMATS = frozenset({"auto", "safetensors", "pt", "npcache", "fastsafetensors",
                                           "mistral", "sharded_state", "runai_streamer", "tensorizer"})
KV_DTYPE_ALIASES = {"fp8": "fp8_e4m3"}
DTYPE_ALIASES = {"half": "float16", "float": "float32", "fp16": "float16", "fp32": "float32", "bf16": "bfloat16"}


def model_identity(path: str | os.PathLike[str] | None, settings: dict[str, Any], mode: str = "sampled") -> str:
    """The identity of the weights under ``path`` loaded with ``settings`` (from `model_settings`).

    Args:
        path: the checkpoint directory (or weight file) the engine loaded.
        settings: the normalized settings.
        mode: the fingerprint's mode, "sampled" or "full" (`fingerprint.weights_fingerprint`); "off": the model's
            name stands for its weights (the operator says so in so many words).
    Returns:
        ``<weights>.<settings>``: the fingerprint's 32 hex digits ("off", or "dummy" for random weights) and the
        settings' digest.
    Raises:
        ConfigError: the checkpoint cannot be read for its fingerprint.
    """
    if mode == "off":
        weights = "off"
    elif settings.get("load_format") == "dummy":
        weights = "dummy"     # random weights from the seed, which is in the settings
    else:
        weights = weights_fingerprint(path if path is not None else "", mode).digest
    return f"{weights}.{settings_digest(settings)}"


def model_settings(*, config: dict[str, Any], dtype: Any, quantization: Any = None, kv_cache_dtype: Any = None,
                   kv_scales: str | None = None, load_format: Any = None, seed: Any = None,
                   engine: str = "") -> dict[str, Any]:
    """The settings record of a model as any engine loads it (see the module for each field's normal form;
    ``engine`` counts for random ``dummy`` weights only)."""
    compute = _dtype_name(dtype)
    if compute in ("", "auto"):
        compute = _dtype_name(config.get("torch_dtype") or config.get("dtype") or "auto")
    kv = _dtype_name(kv_cache_dtype) if kv_cache_dtype not in (None, "", "auto") else compute
    load = str(load_format).lower() if load_format not in (None, "") else None
    if load in VALUE_PRESERVING_LOAD_FORMATS:
        load = None
    method = str(quantization).lower() if quantization else None
    settings = {
        "config": portable_config(config),
        "dtype": compute,
        "quantization": None if method in (None, "none", "auto") else method,
        "kv_cache_dtype": KV_DTYPE_ALIASES.get(kv, kv),
        "kv_scales": kv_scales,
        "load_format": load,
        "seed": seed if load == "dummy" else None,
    }
    if load == "dummy":
        settings["engine"] = engine
    return settings


def checkpoint_identity(path: str | os.PathLike[str], *, dtype: Any, quantization: Any = None,
                        kv_cache_dtype: Any = None, overrides: dict[str, Any] | None = None,
                        mode: str = "sampled") -> str:
    """`model_identity` of the checkpoint directory ``path`` loaded as it is (its values, computed KV scales
    none), with these settings.

    Raises:
        ConfigError: the checkpoint cannot be read.
    """
    settings = model_settings(config=checkpoint_config(path, overrides), dtype=dtype, quantization=quantization,
                              kv_cache_dtype=kv_cache_dtype)
    return model_identity(path, settings, mode)


def checkpoint_config(path: str | os.PathLike[str] | None, overrides: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
    """The checkpoint's ``config.json`` (empty where it has none: a single weight file) with ``overrides`` (the
    engine's ``hf_overrides`` or ``--json-model-override-args``) merged in, nested dicts key by key.

    Raises:
        ConfigError: the file is not a JSON object.
    """
    config: dict[str, Any] = {}
    file = os.path.join(path, "config.json") if path is not None and os.path.isdir(path) else None
    if file is not None and os.path.isfile(file):
        try:
            with open(file, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"kvstore: cannot read the model config {file}: {exc}") from None
        if not isinstance(config, dict):
            raise ConfigError(f"kvstore: the model config {file} is not a JSON object")
    return _merged(config, overrides or {})


def _merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def file_digest(path: str | os.PathLike[str]) -> str:
    """The digest (32 hex digits) of one small file's bytes (a KV scales file), nothing of its path."""
    with open(path, "rb") as f:
        return xxhash.xxh3_128_hexdigest(f.read())


def portable_config(config: dict[str, Any]) -> dict[str, Any]:
    """A model config without what differs between hosts of the same model (its local path, the library's
    version, private fields)."""
    return {str(k): portable_config(v) if isinstance(v, dict) else v for k, v in config.items()
            if not (isinstance(k, str) and (k.startswith("_") or k in ("transformers_version", "name_or_path")))}


def _dtype_name(dtype: Any) -> str:
    text = str(dtype).lower()
    text = text[len("torch."):] if text.startswith("torch.") else text
    return DTYPE_ALIASES.get(text, text)
