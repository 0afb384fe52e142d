"""vLLM connector (KV connector API v1; vLLM 0.32 and 0.33): prompt prefixes from and to kvstore.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KVStoreConnector",
        "kv_connector_module_path": "kvstore.connectors.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"address": "ipc:///run/kvstore/kvstore.sock", "chunk_tokens": 256}}'

Extra config: `address` (default: the daemon's default socket), `chunk_tokens` (a multiple of vLLM's block
size; default 256), `model_id` (default: the served model and revision), `cache_salt` (added to every
namespace), `timeout` (seconds a daemon call may take, default 2), `retry_s` (how long to run without the
daemon after it failed, default 5), `load_async` (true: loads off the engine's step; false: in it; default
"auto": off it while other requests run, in it when the engine is idle), `save_async` (default true: saves off
the step), `max_save_bytes` (saves in flight, default 1 GiB; more is dropped), `lookup_batch` (waiting
requests looked up in one daemon round trip, default 64), `gpu_tier` (CUDA engines: map the daemon's GPU
pool, default true), `verify_fraction` (the share of would-be hits computed and compared with the store instead
of loaded, from 0 to 1; default 0: see "Online verification"), `fingerprint` ("sampled", "full" or "off": how
the weights are fingerprinted into every key; ``identity.py``), `weights_version` (the weights' version before any
`reset_cache()`). `kv_role`: `kv_both`, `kv_producer` (saves, never loads)
or `kv_consumer` (loads, never saves).

How a request flows
-------------------
Scheduler (`_vllm_scheduler.SchedulerSide`). `get_num_new_matched_tokens` asks the daemon once per request: the first
time a request is considered, it and the other waiting requests not asked about yet (`on_new_request`) are looked up in
one round trip; the answer (leading chunks stored, for every tensor-parallel rank's namespace) is kept until the request
is scheduled or finished. It offers those chunks less what vLLM already holds, never the prompt's last token, and says
the load is asynchronous when other requests are running: vLLM parks the request in WAITING_FOR_REMOTE_KVS, gives it
blocks, and keeps running the rest of the batch. (On an idle engine nothing would overlap the load, so it runs in the
step before the forward, sparing the request the steps an asynchronous load waits to be reported.)
`build_connector_meta` sends the workers each step's loads and saves (every full prompt chunk that becomes computed in
the step and is not known stored) and the preempted requests. A request with saves in flight keeps its blocks after it
finishes (`request_finished` returns True) until the workers report the saves done.

Worker (`_vllm_worker.WorkerSide`, over `_transfers.Transfers`). `start_load_kv` queues the loads on a background
thread, which leases the chunks and scatters the leased views straight into the request's blocks; `get_finished` reports
finished loads (and, through `get_block_ids_with_load_errors`, the blocks a missing chunk left unwritten, which vLLM
recomputes under `kv_load_failure_policy: recompute`). `wait_for_save` queues the step's saves on a second thread, which
reserves arena slots, gathers the blocks straight into them and commits; `get_finished` reports a finished request once
its saves are done. `handle_preemptions` settles a preempted request's saves before its blocks are reused. With
`load_async`/`save_async` false the same work runs inside the step.

Online verification. A request chosen by `verify_fraction` (a hash of its id: the same answer each time, all
at 1.0) is offered no external tokens though its chunks are stored, so vLLM computes its prefix; once those
chunks are computed the save thread, off the step and bounded like saves, compares them with the stored ones
(exactly in float32 on the CPU, `tolerance_for` the dtype elsewhere) and reports to the daemon, which counts it
under `verify` and drops a chain from its first chunk that differs (not saved again by this request). The
output is plain prefill's; a failed comparison is a log line. Default 0: a verified hit costs the prefill it
would have saved (``bench/verify.py`` measures what a fraction costs in throughput).

Chunks are the engine's own block bytes (`kvstore.ops` block planes), every KV cache group's blocks of the
chunk's tokens, so the namespace names the KV cache format: per model family (dense, MLA, sliding-window and
hybrid groups, pipeline stages, fp8) what a chunk holds is `vllm_geometry`'s; for Mamba-2 / linear-attention
hybrids (vLLM's align mode) a chunk also holds each recurrent layer's state at its last token (`hybrid`). A
cache it does not describe (a state outside align mode, cross attention...) turns the connector off: one line
naming the family and the reason, and a connector report the daemon shows as off (`kvstore stats`, /metrics).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

import vllm
from kvstore.errors import ConfigError
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from ..common.families import Unsupported
from ..common.report import refuse
from .config import VllmConnectorConfig
from .geometry import EngineGeometry, engine_geometry
from .identity import model_identity, neutral_identity
from .records import KVStoreConnectorMetadata, LoadSpec, SaveSpec
from .scheduler import SchedulerSide
from .settings import SUPPORTED_VLLM, check_vllm_version, model_id, vllm_engine_identity
from .shared import ConnectorSettings
from .stats import KVStoreConnectorStats
from .worker import WorkerSide

if TYPE_CHECKING:
    import kvstore
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["KVStoreConnector", "KVStoreConnectorMetadata", "LoadSpec", "SaveSpec", "SUPPORTED_VLLM",
           "check_vllm_version"]


class KVStoreConnector(KVConnectorBase_V1, SupportsHMA):
    """Loads prompt prefixes from, and saves them to, a kvstore daemon (every KV cache group: `SupportsHMA`
    keeps vLLM's hybrid allocator on, so sliding-window groups hold only the blocks inside their window).

    vLLM makes one instance per role: the scheduler's runs a `SchedulerSide` (`scheduler_side`), each worker's
    a `WorkerSide` (`worker_side`); the other is None, as is either while the connector is off."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"
    ) -> None:
        check_vllm_version(vllm.__version__)
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.scheduler_side: SchedulerSide | None = None
        self.worker_side: WorkerSide | None = None
        self._off_report: kvstore.Client | None = None   # holds the daemon's view of this connector as off
        self._settings = self._read_settings(vllm_config, role, kv_cache_config)
        if self._settings.geometry is None:
            return
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler_side = SchedulerSide(self._settings)
        else:
            self.worker_side = WorkerSide(self._settings, vllm_config, kv_cache_config.num_blocks)

    def _read_settings(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                       kv_cache_config: "KVCacheConfig") -> ConnectorSettings:
        config = VllmConnectorConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config)
        block_size = vllm_config.cache_config.block_size
        chunk_tokens = config.chunk_tokens
        if chunk_tokens % block_size:
            raise ConfigError(f"kvstore chunk_tokens {chunk_tokens} must be a positive multiple of vLLM's "
                              f"block size {block_size}")
        geometry: EngineGeometry | None = None
        try:
            geometry = engine_geometry(kv_cache_config, chunk_tokens, vllm_config)
        except Unsupported as exc:
            if role == KVConnectorRole.SCHEDULER:  # one line per engine; its workers stay quiet
                self._off_report = refuse(config.address, "vllm", exc, config.timeout)
        # A sliding-window group's blocks behind the window are freed at the next schedule: save in the step.
        save_async = config.save_async and not (geometry is not None and geometry.frees_blocks)
        return ConnectorSettings(
            geometry, chunk_tokens, config.model_id or model_id(vllm_config), config.cache_salt,
            vllm_config.parallel_config.tensor_parallel_size,
            self._kv_transfer_config.is_kv_consumer, self._kv_transfer_config.is_kv_producer, save_async, config,
            identity=vllm_engine_identity(vllm_config, config.engine_id, config.served_model_name),
            model_identity=_identity(vllm_config, config, geometry) if role == KVConnectorRole.SCHEDULER else "",
        )

    # -- scheduler side ----------------------------------------------------------------------------------
    def on_new_request(self, request: "Request") -> None:
        if self.scheduler_side is not None:
            self.scheduler_side.on_new_request(request)

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        if self.scheduler_side is None:
            return 0, False
        return self.scheduler_side.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        if self.scheduler_side is not None:
            self.scheduler_side.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        if self.scheduler_side is None:
            return KVStoreConnectorMetadata()
        return self.scheduler_side.build_connector_meta(scheduler_output)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self.scheduler_side is None:
            return False, None
        return self.scheduler_side.request_finished(request)

    def request_finished_all_groups(self, request: "Request", block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, list(block_ids[0]) if block_ids else [])

    def get_loaded_kv_cache_group_ids(self, request: "Request") -> tuple[int, ...]:
        """Every transferred group: a load writes all of them (a hybrid model's recurrent state included)."""
        g = self._settings.geometry
        if g is None or not g.hybrid:
            return super().get_loaded_kv_cache_group_ids(request)
        return tuple(self._kv_cache_config.transfer_group_ids)

    # -- worker side -------------------------------------------------------------------------------------
    def _step_meta(self) -> KVStoreConnectorMetadata | None:
        """This step's metadata, when the worker half is on and the step has any."""
        if self.worker_side is None or not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVStoreConnectorMetadata)
        return meta

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self.worker_side is not None:
            self.worker_side.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._step_meta()
        if meta is not None and self.worker_side is not None:
            self.worker_side.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # synchronous loads are complete before the forward; asynchronous ones are not in this step

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata", **kwargs: Any
    ) -> None:
        return  # the step's saves are queued whole in wait_for_save

    def wait_for_save(self) -> None:
        meta = self._step_meta()
        if meta is not None and self.worker_side is not None:
            self.worker_side.wait_for_save(meta)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self.worker_side is not None and isinstance(kv_connector_metadata, KVStoreConnectorMetadata):
            self.worker_side.handle_preemptions(kv_connector_metadata)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self.worker_side is None:
            return None, None
        return self.worker_side.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker_side.take_load_errors() if self.worker_side is not None else set()

    def reset_cache(self) -> bool | None:
        """Forget every chunk saved before now, after the weights changed in place (vLLM calls it from
        ``reset_prefix_cache(reset_connector=True)``, on the scheduler): see ``SchedulerSide.reset_cache``. Nothing
        is deleted from the daemon."""
        return self.scheduler_side.reset_cache() if self.scheduler_side is not None else None

    # -- both --------------------------------------------------------------------------------------------
    def get_kv_connector_stats(self) -> KVStoreConnectorStats | None:
        """kvstore's counts since vLLM last asked (the scheduler's hits, a worker's loads and saves)."""
        side = self.scheduler_side or self.worker_side
        return side.take_stats() if side is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVStoreConnectorStats:
        """The stats `to_dict()` sent from a worker or the scheduler, rebuilt in vLLM's logger."""
        return KVStoreConnectorStats(data=dict(data or {}))

    @property
    def stats(self) -> dict[str, int | float]:
        """What this side has done: lookups and plans (scheduler), chunks moved and dropped (worker)."""
        if self.scheduler_side is not None:
            return self.scheduler_side.stats
        return self.worker_side.stats if self.worker_side is not None else {}

    def shutdown(self) -> None:
        if self.worker_side is not None:
            self.worker_side.close()
        self._settings.close_links()
        if self._off_report is not None:
            self._off_report.close()


def _identity(vllm_config: "VllmConfig", config: VllmConnectorConfig, geometry: EngineGeometry | None) -> str:
    """The model identity in the scheduler's keys: engine-neutral for the canonical format, vLLM's own else."""
    if geometry is None:
        return ""
    if geometry.canonical is not None:
        return neutral_identity(vllm_config, config.fingerprint, config.model_id or model_id(vllm_config))
    return model_identity(vllm_config, config.fingerprint)

