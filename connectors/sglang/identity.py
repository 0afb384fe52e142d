"""The model's identity in the SGLang backend's keys, kept in step with the weights SGLang serves.

SGLang names a page by its tokens, `extra_key` and `cache_salt` only; the backend adds the rest of what shapes its
KV. `ModelKeys.root` (the key root's model part) holds:

- the model's identity (``common/model_identity.py``): a fingerprint of the weights SGLang loaded (the checkpoint
  at its published ``model_path``) and a digest of the settings that change KV at the same shape (the
  checkpoint's ``config.json`` with ``--json-model-override-args`` merged in, and from SGLang's model config the dtype,
  ``--quantization``, ``--kv-cache-dtype``, the KV scales file ``--quantization-param-path``, the load format and,
  for random ``dummy`` weights, ``--random-seed``);
- the weights' version: the backend's configured ``weights_version`` and SGLang's own ``weight_version`` (which
  every ``update_weights_from_*`` request that names one records, and ``--weight-version`` sets at start);
- an epoch, moved by a ``/flush_cache`` after which SGLang's record of its weights says nothing new;
- the content fingerprints of the LoRA adapters given at start (``--lora-paths``). SGLang puts a page's adapter in
  its page hash by an id made of the adapter's name and path only, and the backend never learns which adapter a
  page belongs to: so every page of an engine started with adapters is keyed by all of them, and an adapter
  rewritten at the same path and name is a miss in a new engine (the price: engines started with other adapter
  sets share no page, base-model pages included). Adapters loaded at run time (``/load_lora_adapter``) get a
  random id from SGLang: their pages are never found by another engine or after a restart.

Both of the backend's key formats hang from it: `ModelKeys.root` for a format of SGLang's own (``sglang:MODEL``)
and `ModelKeys.part` (``canonical.identity_root``) for the canonical chunks every engine reads (``kv:MODEL``).
In the part, SGLang's ``weight_version`` and the epoch count only once SGLang's record differs from its start
(its version still ``default``, no epoch): until then the part is the identity and the configured
``weights_version``, as vLLM's connector makes it for the same checkpoint and settings, so the two engines share.

SGLang calls no backend method when weights change or its caches are flushed, so the backend looks, at every
storage call, at what SGLang publishes: the model bag's ``model_path`` and ``load_format`` (which
``update_weights_from_disk`` overrides), the serving bag's ``weight_version``, and whether the host pool was
cleared (a flush clears it: its ``mem_state`` is a new tensor). Then:

- ``update_weights_from_disk`` (a new path, or the same path rewritten: SGLang logs one more
  ``update_model_fields`` override): the weights are fingerprinted again, so keys follow the bytes now loaded, and
  engines that load the same bytes share;
- any update that names a ``weight_version``: keys follow that version (engines given the same version share);
- a flush with neither (``update_weights_from_tensor`` / ``_distributed`` / ``_ipc`` naming no version, or a plain
  flush): with ``reset_on_flush`` (the default) the epoch moves to a value no engine has used, so nothing saved
  before is found after; nothing is deleted. ``"reset_on_flush": false`` keeps what was saved before a plain flush
  loadable by the same engine, for deployments that never update weights in place without naming a version,
  and keeps sharing with other engines across the flushes of a deployment that flushes SGLang's cache for other
  reasons (a flush that moves the epoch moves this engine's canonical keys away from every other engine's).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from typing import Any, NamedTuple

import xxhash

from kvstore.errors import ConfigError

from ..common.canonical import identity_root
from ..common.keying import AdapterFingerprints, Unkeyable
from ..common.model_identity import checkpoint_config, file_digest, model_identity, model_settings

log = logging.getLogger("kvstore.connectors.sglang")

UPDATE_SOURCE = "model_runner.update_model_fields"   # the override update_weights_from_disk logs
DEFAULT_WEIGHT_VERSION = "default"                     # SGLang's weight_version without --weight-version


class WeightsRecord(NamedTuple):
    """What SGLang publishes of the weights it serves."""

    model_path: str
    load_format: str
    weight_version: str


def published_record() -> WeightsRecord | None:
    """SGLang's record of its weights in this process, or None where no config is published (a backend built
    outside a server)."""
    try:
        from sglang.srt.runtime_context import get_model, get_serving

        model = get_model()
        return WeightsRecord(str(model.model_path), str(model.load_format), str(get_serving().weight_version))
    except (ImportError, ValueError, AttributeError):
        return None


def disk_updates() -> int:
    """How many times this process's weights were loaded from disk again (SGLang's override log)."""
    try:
        from sglang.srt.runtime_context import get_context

        return sum(1 for source, _ in get_context().overrides_log() if source == UPDATE_SOURCE)
    except (ImportError, ValueError, AttributeError):
        return 0


def sglang_settings(path: str | None, load_format: str) -> dict[str, Any]:
    """The normalized settings (``common/model_identity.py``) of the model SGLang serves in this process: the
    checkpoint's config at ``path`` with ``--json-model-override-args`` merged in, and the rest from SGLang's own
    model config."""
    from sglang.srt.runtime_context import get_device, get_model, process_model_config

    config = process_model_config()
    model = get_model()
    overrides = json.loads(getattr(model, "json_model_override_args", None) or "{}")
    scales = getattr(model, "quantization_param_path", None)
    return model_settings(
        config=checkpoint_config(path, overrides if isinstance(overrides, dict) else None),
        dtype=getattr(config, "dtype", ""),
        quantization=getattr(config, "quantization", None),
        kv_cache_dtype=getattr(model, "kv_cache_dtype", None),
        kv_scales=file_digest(scales) if scales else None,
        load_format=load_format,
        seed=getattr(get_device(), "random_seed", None),
        engine="sglang",
    )


def start_adapters() -> str:
    """A digest of the content fingerprints of the LoRA adapters SGLang was started with, each under SGLang's id
    for it; "" without adapters.

    Raises:
        Unkeyable: an adapter's files cannot be read here.
    """
    try:
        from sglang.srt.runtime_context import get_lora

        lora = get_lora()
        refs = list(lora.lora_paths or []) if getattr(lora, "enable_lora", False) else []
    except (ImportError, ValueError, AttributeError):
        return ""
    if not refs:
        return ""
    adapters = AdapterFingerprints()
    return xxhash.xxh3_64_hexdigest(";".join(sorted(f"{getattr(ref, 'lora_id', '')}={adapters.of(ref)}"
                                                    for ref in refs)).encode())


def checkpoint_path(path: str, revision: str | None = None) -> str:
    """The local directory of the weights at ``path``: the path itself, or the hub's local snapshot."""
    if os.path.exists(path):
        return path
    try:
        from huggingface_hub import snapshot_download

        return str(snapshot_download(path, revision=revision, local_files_only=True))
    except Exception as exc:  # noqa: BLE001 - any failure to find it is the same answer
        raise ConfigError(f"kvstore: cannot find the weights of {path!r} on this host for the weights "
                          f"fingerprint ({exc}); set the backend's extra config fingerprint \"off\" and a "
                          f"model_id that names these weights exactly") from None


class ModelKeys:
    """The model part of one backend's keys, moved as SGLang's weights change (see the module): `root` for a
    format of SGLang's own (``sglang:MODEL``), `part` for canonical chunks (``kv:MODEL``).

    `root()` and `part()` are called on every storage call: while nothing changed they read three published
    fields and compare one tensor's identity.
    """

    def __init__(self, pool: Any, mode: str, weights_version: str, reset_on_flush: bool) -> None:
        self._pool = pool
        self._mode = mode
        self._version = weights_version
        self._reset_on_flush = reset_on_flush
        self._lock = threading.Lock()
        self._record = published_record()
        self._updates = disk_updates()
        self._mark = getattr(pool, "mem_state", None)
        self._epoch = ""
        self._config_path: str | None = None
        self._identity = self._model_identity(self._record)
        self._keys = self._make_keys()
        log.info("kvstore: keys of model %s, weight_version %s", self._identity,
                 self._record.weight_version if self._record else "-")

    def root(self) -> bytes:
        """The model part of the key root for the weights SGLang serves now (a format of SGLang's own)."""
        return self._current()[0]

    def part(self) -> str:
        """The model part of canonical chunk keys (``canonical.identity_root``) for the weights SGLang serves now.
        While SGLang's record says nothing beyond its start (its ``weight_version`` at its default, no epoch),
        it is the model's identity and the configured ``weights_version`` alone: what vLLM's connector computes
        for the same checkpoint, settings and ``weights_version``, so the two engines share chunks."""
        return self._current()[1]

    def reset(self) -> None:
        """Move the epoch to a value no engine has used (the backend's ``clear()``)."""
        with self._lock:
            self._epoch = f"reset-{uuid.uuid4().hex}"
            self._keys = self._make_keys()

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def config_path(self) -> str | None:
        """The checkpoint directory whose ``config.json`` SGLang parsed at start (None outside a server)."""
        return self._config_path

    def _current(self) -> tuple[bytes, str]:
        record = published_record()
        if record == self._record and getattr(self._pool, "mem_state", None) is self._mark:
            return self._keys
        with self._lock:
            self._follow(record)
            return self._keys

    def _follow(self, record: WeightsRecord | None) -> None:
        mark = getattr(self._pool, "mem_state", None)
        flushed = mark is not self._mark
        updates = disk_updates() if flushed or record != self._record else self._updates
        old = self._record
        reloaded = updates != self._updates or (record is not None and old is not None
                                                 and record[:2] != old[:2])
        if reloaded:
            self._identity = self._model_identity(record)
        if reloaded or (record is not None and old is not None and record.weight_version != old.weight_version):
            self._epoch = ""                     # SGLang's record names the weights now served
        elif flushed and self._reset_on_flush:
            self._epoch = f"reset-{uuid.uuid4().hex}"
        if reloaded or record != old or (flushed and self._reset_on_flush):
            log.info("kvstore: keys follow the weights now served (model %s, weight_version %s%s)",
                     self._identity, record.weight_version if record else "-",
                     f", {self._epoch}" if self._epoch else "")
        self._record, self._updates, self._mark = record, updates, mark
        self._keys = self._make_keys()

    def _model_identity(self, record: WeightsRecord | None) -> str:
        if record is None:
            return "unpublished"          # a backend built outside a server: no model to fingerprint
        try:
            if self._config_path is None:   # the config SGLang parsed at start: an update loads weights only
                self._config_path = _local(record.model_path, self._mode)
            settings = sglang_settings(self._config_path or None, record.load_format)
            path = checkpoint_path(record.model_path) if self._mode != "off" else None
            adapters = start_adapters()
            return model_identity(path, settings, self._mode) + (f".lora-{adapters}" if adapters else "")
        except (ConfigError, OSError, Unkeyable) as exc:
            # keys of weights no one can name: never found by another engine, never stale
            log.warning("kvstore: %s; this engine's pages are keyed by a value of its own", exc)
            return f"unknown-{uuid.uuid4().hex}"

    def _make_keys(self) -> tuple[bytes, str]:
        """(`root`, `part`) of the identity, versions and epoch now."""
        version = self._record.weight_version if self._record is not None else ""
        text = f"model={self._identity};weights={self._version};sglang_weights={version};epoch={self._epoch}"
        weights = self._version
        if version not in ("", DEFAULT_WEIGHT_VERSION) or self._epoch:   # what only SGLang records
            weights = f"{self._version};sglang_weights={version};epoch={self._epoch}"
        return xxhash.xxh3_128_digest(text.encode()), identity_root(self._identity, weights)


def _local(path: str, mode: str) -> str:
    """The checkpoint directory at ``path``; "" where it is nowhere on this host and the fingerprint is off (the
    model's name then stands for its config too)."""
    try:
        return checkpoint_path(path)
    except ConfigError:
        if mode == "off":
            return ""
        raise
