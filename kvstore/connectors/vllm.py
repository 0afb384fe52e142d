"""vLLM connector (KV connector API v1, vLLM 0.33): prompt prefixes from and to kvstore.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KVStoreConnector",
        "kv_connector_module_path": "kvstore.connectors.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"address": "ipc:///run/kvstore/kvstore.sock", "chunk_tokens": 256}}'

Extra config: `address` (default: the daemon's default socket), `chunk_tokens`
(a multiple of vLLM's block size; default 256), `model_id` (default: the served
model and revision), `cache_salt` (added to every namespace), `timeout`
(seconds a daemon call may take, default 2) and `retry_s` (how long to run
without the daemon after it failed, default 5).

How a request flows
-------------------
Scheduler: `get_num_new_matched_tokens` computes the prompt's chunk keys and
asks the daemon how many lead chunks it holds (a lookup, which pins nothing),
for every tensor-parallel rank's namespace, and offers the smallest count,
less what vLLM already holds and never the prompt's last token. A daemon that
is down or erroring answers 0: a normal prefill. `update_state_after_alloc`
notes the load; `build_connector_meta` sends each worker the loads (token ids,
block ids, how many leading tokens to leave alone) and the saves (every full
prompt chunk that becomes computed in this step and is not known stored).

Worker: `start_load_kv` reads the chunks and scatters them into the paged
per-layer caches through the request's block ids before the forward runs, so
`wait_for_layer_load` has nothing to wait for. `save_kv_layer` gathers each
layer's new chunks as the layer finishes; `wait_for_save` fills in any layer
not seen and puts the chunks to the daemon. Loads and saves complete within the
step, so `get_finished` reports nothing pending. A chunk that vanished between
lookup and load is reported by `get_block_ids_with_load_errors`; with
`kv_load_failure_policy: recompute` vLLM then recomputes those blocks.

Supported: one KV cache group of full attention with equal K and V head sizes
(the common decoder models). Anything else disables the connector (no hits, no
saves) with a warning.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from ._store import ChunkStore, DaemonLink
from .layout import (
    KVGeometry,
    gather_paged_layer,
    namespace,
    paged_slots,
    scatter_paged,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger("kvstore.connectors.vllm")

__all__ = ["KVStoreConnector", "KVStoreConnectorMetadata", "LoadSpec", "SaveSpec"]


@dataclass
class LoadSpec:
    """Load chunks `0 .. num_chunks` of a request, writing from token `skip_tokens` on."""

    req_id: str
    token_ids: list[int]
    block_ids: list[int]
    num_chunks: int
    skip_tokens: int
    salt: str = ""


@dataclass
class SaveSpec:
    """Save chunks `first_chunk .. first_chunk + num_chunks` of a request."""

    req_id: str
    token_ids: list[int]
    block_ids: list[int]
    first_chunk: int
    num_chunks: int
    salt: str = ""


@dataclass
class KVStoreConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)


@dataclass
class _Tracked:
    """Scheduler-side state of one running request."""

    prompt: list[int]
    block_ids: list[int]
    saved_chunks: int
    salt: str


class KVStoreConnector(KVConnectorBase_V1):
    """Loads prompt prefixes from, and saves them to, a kvstore daemon."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._block_size = vllm_config.cache_config.block_size
        self._chunk_tokens = int(extra.get("chunk_tokens", 256))
        if self._chunk_tokens % self._block_size:
            raise ValueError(
                f"kvstore chunk_tokens {self._chunk_tokens} must be a multiple of the block size {self._block_size}"
            )
        self._load_enabled = self._kv_transfer_config.is_kv_consumer
        self._save_enabled = self._kv_transfer_config.is_kv_producer
        parallel = vllm_config.parallel_config
        self._tp_size = parallel.tensor_parallel_size
        self._geometry = _geometry(kv_cache_config, self._chunk_tokens)
        if parallel.pipeline_parallel_size > 1:
            self._geometry = None  # stages hold different layers; not supported yet
        self._model_id = str(extra.get("model_id") or _model_id(vllm_config))
        self._salt = str(extra.get("cache_salt", ""))
        self._link = DaemonLink.to(
            extra.get("address"), self._chunk_tokens, timeout=float(extra.get("timeout", 2.0)),
            retry_s=float(extra.get("retry_s", 5.0)),
        )
        # scheduler side
        self._stores: list[ChunkStore] = []
        self._lookups: dict[str, int] = {}  # req id -> chunks found by the last lookup
        self._salts: dict[str, str] = {}  # req id -> the request's cache salt
        self._loads: dict[str, tuple[int, int]] = {}  # req id -> (chunks, tokens to skip)
        self._tracked: dict[str, _Tracked] = {}
        # worker side
        self._layers: list[torch.Tensor] = []
        self._store: ChunkStore | None = None
        self._pending: list[tuple[SaveSpec, torch.Tensor, set[int], tuple]] = []
        self._load_errors: set[int] = set()
        if self._geometry is None:
            log.warning("kvstore connector disabled: unsupported KV cache layout %s", kv_cache_config)
        elif role == KVConnectorRole.SCHEDULER:
            self._stores = [self._chunk_store(rank) for rank in range(self._tp_size)]

    # -- shared ------------------------------------------------------------------------------------------
    def _chunk_store(self, tp_rank: int) -> ChunkStore:
        assert self._geometry is not None
        ns = namespace(f"vllm:{self._model_id}", self._geometry, tp_rank=tp_rank, tp_size=self._tp_size,
                       salt=self._salt)
        return ChunkStore(self._link, ns, self._geometry)

    @property
    def _enabled(self) -> bool:
        return self._geometry is not None

    # -- scheduler side ----------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        salt = getattr(request, "cache_salt", None) or ""
        self._salts[request.request_id] = salt
        if not (self._enabled and self._load_enabled):
            return 0, False
        t = self._chunk_tokens
        tokens = list(request.all_token_ids[: request.num_tokens])
        usable = (len(tokens) - 1) // t  # leave the last token to compute
        if usable * t <= num_computed_tokens:
            return 0, False
        hits = usable
        for store in self._stores:
            hits = store.lookup(store.keys(tokens[: hits * t], salt))
            if hits * t <= num_computed_tokens:
                break
        self._lookups[request.request_id] = hits
        return max(0, hits * t - num_computed_tokens), False

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        hits = self._lookups.pop(request.request_id, 0)
        if num_external_tokens > 0 and hits > 0:
            self._loads[request.request_id] = (hits, hits * self._chunk_tokens - num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = KVStoreConnectorMetadata()
        if not self._enabled:
            return meta
        for new in scheduler_output.scheduled_new_reqs:
            loaded = self._loads.get(new.req_id, (0, 0))[0]
            self._tracked[new.req_id] = _Tracked(
                list(new.prompt_token_ids or []), list(new.block_ids[0]), loaded, self._salts.pop(new.req_id, "")
            )
            done = new.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            self._plan(new.req_id, done, meta)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = list(new_blocks[0]) if new_blocks else []
            elif new_blocks:
                tracked.block_ids.extend(new_blocks[0])
            done = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            self._plan(req_id, done, meta)
        self._loads.clear()
        return meta

    def _plan(self, req_id: str, computed: int, meta: KVStoreConnectorMetadata) -> None:
        tracked = self._tracked[req_id]
        t = self._chunk_tokens
        load = self._loads.get(req_id)
        if load is not None:
            chunks, skip = load
            meta.loads.append(
                LoadSpec(req_id, tracked.prompt[: chunks * t], list(tracked.block_ids), chunks, skip, tracked.salt)
            )
        ready = min(computed, len(tracked.prompt)) // t
        if self._save_enabled and ready > tracked.saved_chunks:
            first = tracked.saved_chunks
            meta.saves.append(
                SaveSpec(req_id, tracked.prompt[: ready * t], list(tracked.block_ids[: ready * t // self._block_size]),
                         first, ready - first, tracked.salt)
            )
            tracked.saved_chunks = ready

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._tracked.pop(request.request_id, None)
        self._lookups.pop(request.request_id, None)
        self._salts.pop(request.request_id, None)
        self._loads.pop(request.request_id, None)
        return False, None  # saves finish within the step that computed them

    # -- worker side -------------------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if not self._enabled:
            return
        names = self._kv_cache_config.kv_cache_groups[0].layer_names
        missing = [n for n in names if n not in kv_caches]
        if missing:
            log.warning("kvstore connector disabled: no KV cache for layers %s", missing[:3])
            self._geometry = None
            return
        self._layers = [kv_caches[n] for n in names]
        self._layer_index = {n: i for i, n in enumerate(names)}
        self._store = self._chunk_store(_tp_rank(self._vllm_config))

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        if self._store is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVStoreConnectorMetadata)
        for spec in meta.loads:
            try:
                self._load(spec)
            except Exception as exc:  # noqa: BLE001 - a failed load is a recompute, never a failed step
                log.warning("kvstore load of request %s failed: %s", spec.req_id, exc)
                self._fail_blocks(spec, spec.skip_tokens)

    def _load(self, spec: LoadSpec) -> None:
        assert self._store is not None
        t = self._chunk_tokens
        first = spec.skip_tokens // t
        keys = self._store.keys(spec.token_ids, spec.salt)[first: spec.num_chunks]
        chunks = self._store.load(keys, device=self._layers[0].device)
        table = torch.tensor(spec.block_ids, dtype=torch.long, device=self._layers[0].device)
        scatter_paged(chunks, self._layers, table, first, spec.skip_tokens - first * t, self._block_size)
        loaded_to = (first + len(chunks)) * t
        if loaded_to < spec.num_chunks * t:
            self._fail_blocks(spec, max(loaded_to, spec.skip_tokens))

    def _fail_blocks(self, spec: LoadSpec, from_token: int) -> None:
        end = spec.num_chunks * self._chunk_tokens
        first_block, last_block = from_token // self._block_size, -(-end // self._block_size)
        self._load_errors.update(spec.block_ids[first_block:last_block])

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv completed every load before the forward

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata", **kwargs: Any
    ) -> None:
        if self._store is None or not self.has_connector_metadata():
            return
        layer = self._layer_index.get(layer_name)
        if layer is None:
            return
        for _, staging, seen, slots in self._staged():
            gather_paged_layer(kv_layer, slots, staging[:, layer])
            seen.add(layer)

    def _staged(self) -> list[tuple[SaveSpec, torch.Tensor, set[int], tuple]]:
        """Staging buffers for this step's saves, made on first use in the step."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVStoreConnectorMetadata)
        if not self._pending and meta.saves:
            device = self._layers[0].device
            kbs = self._layers[0].shape[2]
            t = self._chunk_tokens
            for spec in meta.saves:
                table = torch.tensor(spec.block_ids, dtype=torch.long, device=device)
                start, end = spec.first_chunk * t, (spec.first_chunk + spec.num_chunks) * t
                slots = paged_slots(table, start, end, self._block_size, kbs)
                self._pending.append((spec, self._geometry.empty_chunks(spec.num_chunks, device), set(), slots))
        return self._pending

    def wait_for_save(self) -> None:
        if self._store is None or not self.has_connector_metadata():
            return
        try:
            for spec, staging, seen, slots in self._staged():
                for layer, cache in enumerate(self._layers):
                    if layer not in seen:
                        gather_paged_layer(cache, slots, staging[:, layer])
                keys = self._store.keys(spec.token_ids, spec.salt)
                self._store.store(keys, staging, spec.first_chunk)
        except Exception as exc:  # noqa: BLE001 - a lost save is a future miss
            log.warning("kvstore save failed: %s", exc)
        finally:
            self._pending = []

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        self._link.close()


def _geometry(kv_cache_config: "KVCacheConfig", chunk_tokens: int) -> KVGeometry | None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    if len(groups) != 1:
        return None
    spec = groups[0].kv_cache_spec
    plain = (
        type(spec) is FullAttentionSpec
        and spec.sliding_window is None
        and spec.attention_chunk_size is None
        and spec.head_size_v == spec.head_size
        and getattr(spec, "num_head_slots", None) is None
        and getattr(spec, "state_content_bytes", None) is None
        and getattr(spec.kv_quant_mode, "name", "NONE") == "NONE"
    )
    if not plain:
        return None
    return KVGeometry(len(groups[0].layer_names), spec.num_kv_heads, spec.head_size, spec.dtype, chunk_tokens)


def _model_id(vllm_config: "VllmConfig") -> str:
    model = getattr(vllm_config, "model_config", None)
    if model is None:
        return "unknown-model"
    revision = getattr(model, "revision", None)
    return f"{model.model}@{revision}" if revision else str(model.model)


def _tp_rank(vllm_config: "VllmConfig") -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()
    except Exception:  # noqa: BLE001 - not in a distributed worker (tests, single process)
        rank = getattr(vllm_config.parallel_config, "rank", 0) or int(os.environ.get("RANK", 0))
        return rank % vllm_config.parallel_config.tensor_parallel_size
