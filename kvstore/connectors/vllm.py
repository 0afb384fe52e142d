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
of loaded, from 0 to 1; default 0: see "Online verification"). `kv_role`: `kv_both`, `kv_producer` (saves, never loads) or `kv_consumer` (loads, never
saves).

How a request flows
-------------------
Scheduler. `get_num_new_matched_tokens` asks the daemon once per request: the first time a request is
considered, it and the other waiting requests not asked about yet (`on_new_request`) are looked up in one
round trip; the answer (leading chunks stored, for every tensor-parallel rank's namespace) is kept until the
request is scheduled or finished. It offers those chunks less what vLLM already holds, never the prompt's last
token, and says the load is asynchronous when other requests are running: vLLM parks the request in
WAITING_FOR_REMOTE_KVS, gives it blocks, and keeps running the rest of the batch. (On an idle engine nothing
would overlap the load, so it runs in the step before the forward, sparing the request the steps an
asynchronous load waits to be reported.) `build_connector_meta` sends the workers each step's loads and saves
(every full prompt chunk that becomes computed in the step and is not known stored) and the preempted requests.
A request with saves in flight keeps its blocks after it finishes (`request_finished` returns True) until the
workers report the saves done.

Worker (`_transfers.Transfers`). `start_load_kv` queues the loads on a background thread, which leases the
chunks and scatters the leased views straight into the request's blocks; `get_finished` reports finished loads
(and, through `get_block_ids_with_load_errors`, the blocks a missing chunk left unwritten, which vLLM
recomputes under `kv_load_failure_policy: recompute`). `wait_for_save` queues the step's saves on a second
thread, which reserves arena slots, gathers the blocks straight into them and commits; `get_finished` reports
a finished request once its saves are done. `handle_preemptions` settles a preempted request's saves before
its blocks are reused. With `load_async`/`save_async` false the same work runs inside the step.

Online verification. A request chosen by `verify_fraction` (a hash of its id: the same answer each time, all
at 1.0) is offered no external tokens though its chunks are stored, so vLLM computes its prefix; once those
chunks are computed the save thread, off the step and bounded like saves, compares them with the stored ones
(exactly in float32 on the CPU, `tolerance_for` the dtype elsewhere) and reports to the daemon, which counts it
under `verify` and drops a chain from its first chunk that differs (not saved again by this request). The
output is plain prefill's; a failed comparison is a log line. Default 0: a verified hit costs the prefill it
would have saved (``bench/verify.py`` measures what a fraction costs in throughput).

Chunks are the engine's own block bytes (`kvstore.ops` block planes), every KV cache group's blocks of the
chunk's tokens, so the namespace names the KV cache format: per model family (dense, MLA, sliding-window and
hybrid groups, pipeline stages, fp8) what a chunk holds is `vllm_geometry`'s. A cache it does not describe
(Mamba state, cross attention...) turns the connector off: one line naming the family and the reason, and a
connector report the daemon shows as off (`kvstore stats`, /metrics).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from ..errors import ConfigError
from ..ops import PagedKV
from ._store import ChunkStore, DaemonLink
from .families import Unsupported
from .report import refuse, state_report
from ._transfers import LoadJob, SaveJob, Transfers
from ._vllm_records import KVStoreConnectorMetadata, LoadSpec, SaveSpec, Tracked
from ._vllm_settings import (
    SUPPORTED_VLLM, check_vllm_version, chosen_for_verify, load_mode, model_id, tp_rank, verify_fraction,
)
from .layout import PagedGeometry, paged_namespace
from .vllm_geometry import NULL_BLOCK, EngineGeometry, engine_geometry

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger("kvstore.connectors.vllm")

__all__ = ["KVStoreConnector", "KVStoreConnectorMetadata", "LoadSpec", "SaveSpec", "SUPPORTED_VLLM",
           "check_vllm_version"]

class KVStoreConnector(KVConnectorBase_V1, SupportsHMA):
    """Loads prompt prefixes from, and saves them to, a kvstore daemon (every KV cache group: `SupportsHMA`
    keeps vLLM's hybrid allocator on, so sliding-window groups hold only the blocks inside their window)."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"
    ) -> None:
        check_vllm_version(vllm.__version__)
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._block_size = vllm_config.cache_config.block_size
        self._chunk_tokens = int(extra.get("chunk_tokens", 256))
        if self._chunk_tokens <= 0 or self._chunk_tokens % self._block_size:
            raise ConfigError(f"kvstore chunk_tokens {self._chunk_tokens} must be a positive multiple of vLLM's "
                              f"block size {self._block_size}")
        self._load_enabled = self._kv_transfer_config.is_kv_consumer
        self._save_enabled = self._kv_transfer_config.is_kv_producer
        self._load_mode = load_mode(extra.get("load_async", "auto"))
        self._lookup_batch = max(1, int(extra.get("lookup_batch", 64)))
        self._verify_fraction = verify_fraction(extra.get("verify_fraction", 0.0))
        parallel = vllm_config.parallel_config
        self._tp_size = parallel.tensor_parallel_size
        self._geometry: EngineGeometry | None = None
        self._off_report = None                      # holds the daemon's view of this connector as off
        try:
            self._geometry = engine_geometry(kv_cache_config, self._chunk_tokens, vllm_config)
        except Unsupported as exc:
            if role == KVConnectorRole.SCHEDULER:  # one line per engine; its workers stay quiet
                self._off_report = refuse(extra.get("address"), "vllm", exc, float(extra.get("timeout", 2.0)))
        # A sliding-window group's blocks behind the window are freed at the next schedule: save in the step.
        self._save_async = bool(extra.get("save_async", True)) and not (self._geometry and self._geometry.frees_blocks)
        # vLLM's CPU MLA backend cannot prefill over a prefix it did not compute in the same step (vLLM turns its
        # own prefix caching off there): a hit is offered only when one token is left, computed as a decode.
        self._decode_only = bool(self._geometry and self._geometry.mla
                                 and getattr(vllm_config.device_config, "device_type", "") == "cpu")
        self._model_id = str(extra.get("model_id") or model_id(vllm_config))
        self._salt = str(extra.get("cache_salt", ""))
        self._extra = extra
        self._links: list[DaemonLink] = []
        self._stats: dict[str, int] = {}
        # scheduler side
        self._stores: list[ChunkStore] = []
        self._unasked: dict[str, "Request"] = {}   # waiting requests not looked up yet
        self._lookups: dict[str, tuple[int, int]] = {}  # req id -> (tokens when asked, chunks found)
        self._salts: dict[str, str] = {}
        self._loads: dict[str, LoadSpec] = {}
        self._loaded: dict[str, int] = {}           # req id -> chunks loaded, until the request is tracked
        self._async: dict[str, bool] = {}           # req id -> whether its load was offered as asynchronous
        self._verifying: dict[str, int] = {}        # req id -> stored chunks it computes to compare instead
        self._tracked: dict[str, Tracked] = {}
        # worker side
        self._transfers: Transfers | None = None
        self._ratio = 1                              # kernel blocks per vLLM block
        self._loading: dict[str, LoadSpec] = {}      # asynchronous loads in flight
        self._saving: set[str] = set()               # requests with saves planned (their blocks are kept)
        self._finishing: set[str] = set()            # ... that finished, waiting for their saves
        self._load_errors: set[int] = set()
        self._saves_here = False                     # this worker saves (MLA under TP: rank 0 only)
        if self._geometry is not None and role == KVConnectorRole.SCHEDULER:
            g = self._geometry  # a local client reads lookups from the daemon's shared index
            link = self._link(connector=state_report("vllm", g.family, "on", g.describe()))
            stages = list(zip(g.stages, g.stage_labels)) or [(g.paged, None)]
            ranks = [0] if g.mla else range(self._tp_size)   # an MLA latent is stored once for every rank
            self._stores = [self._chunk_store(rank, link, paged, stage) for paged, stage in stages for rank in ranks]
            link.client()  # connect (and map) now, not on the first request; a daemon that is down: later

    # -- shared ------------------------------------------------------------------------------------------
    def _link(self, **connect: Any) -> DaemonLink:
        link = DaemonLink.to(self._extra.get("address"), self._chunk_tokens,
                             timeout=float(self._extra.get("timeout", 2.0)),
                             retry_s=float(self._extra.get("retry_s", 5.0)), connect=connect)
        self._links.append(link)
        return link

    def _chunk_store(self, tp_rank: int, link: DaemonLink, paged: PagedGeometry | None = None,
                     stage: str | None = None) -> ChunkStore:
        """The chunks of one tensor-parallel rank (none for MLA) of one pipeline stage (this one's by default)."""
        g = self._geometry
        assert g is not None
        ns = paged_namespace(f"vllm:{self._model_id}", paged or g.paged, tp_rank=0 if g.mla else tp_rank,
                             tp_size=1 if g.mla else self._tp_size, salt=self._salt, replicated=g.mla,
                             stage=stage if paged is not None else g.stage)
        return ChunkStore(link, ns, paged or g.paged)

    @property
    def _enabled(self) -> bool:
        return self._geometry is not None

    def _count(self, name: str, n: int = 1) -> None:
        self._stats[name] = self._stats.get(name, 0) + n

    # -- scheduler side ----------------------------------------------------------------------------------
    def on_new_request(self, request: "Request") -> None:
        if self._enabled and self._load_enabled:
            self._unasked[request.request_id] = request

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        self._salts[request.request_id] = getattr(request, "cache_salt", None) or ""
        if not (self._enabled and self._load_enabled):
            return 0, False
        self._count("asked")
        found = self._lookups.get(request.request_id)
        if found is None or found[0] != request.num_tokens:
            self._look_up(request)
            found = self._lookups[request.request_id]
        external = found[1] * self._chunk_tokens - num_computed_tokens
        if external <= 0 or (self._decode_only and found[1] * self._chunk_tokens != request.num_tokens - 1):
            return 0, False  # (the CPU MLA backend computes over a loaded prefix only as a decode step)
        if chosen_for_verify(request.request_id, self._verify_fraction):
            self._verifying[request.request_id] = found[1]  # computed as a miss, compared once computed
            return 0, False
        # Off the step when other requests run (they keep going while this one waits for its KV); in the step
        # when the engine is idle, where it saves the steps an asynchronous load waits for its report.
        asynchronous = self._load_mode == "async" or (self._load_mode == "auto" and bool(self._tracked))
        self._async[request.request_id] = asynchronous
        return external, asynchronous

    def _look_up(self, request: "Request") -> None:
        """Look `request` up, and with it the waiting requests not asked about yet, in one round trip."""
        batch = {request.request_id: request}
        for rid, other in list(self._unasked.items()):
            if len(batch) >= self._lookup_batch:
                break
            batch.setdefault(rid, other)
        t = self._chunk_tokens
        prompts = {rid: list(r.all_token_ids[: r.num_tokens]) for rid, r in batch.items()}
        hits = {rid: (len(tokens) - 1) // t for rid, tokens in prompts.items()}  # leave the last token
        for store in self._stores:
            asked = [rid for rid in batch if hits[rid] > 0]
            salts = {rid: getattr(batch[rid], "cache_salt", None) or "" for rid in asked}
            counts = store.lookup_many([store.keys(prompts[rid][: hits[rid] * t], salts[rid]) for rid in asked])
            self._count("lookup_calls")
            for rid, count in zip(asked, counts):
                hits[rid] = count
        for rid, r in batch.items():
            self._lookups[rid] = (r.num_tokens, hits[rid])
            self._unasked.pop(rid, None)
        self._count("lookups", len(batch))

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        rid = request.request_id
        found = self._lookups.pop(rid, None)
        self._unasked.pop(rid, None)
        if num_external_tokens <= 0 or found is None or found[1] <= 0:
            return
        chunks = found[1]
        end = chunks * self._chunk_tokens
        block_ids = [[NULL_BLOCK if b.is_null else b.block_id for b in group] for group in blocks.blocks]
        self._loads[rid] = LoadSpec(rid, list(request.all_token_ids[:end]), block_ids, chunks,
                                    end - num_external_tokens, self._salts.get(rid, ""), self._async.pop(rid, True))
        self._loaded[rid] = chunks
        self._count("load_specs")

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = KVStoreConnectorMetadata()
        if not self._enabled:
            return meta
        meta.loads, self._loads = list(self._loads.values()), {}
        meta.preempted = list(getattr(scheduler_output, "preempted_req_ids", None) or ())
        if meta.preempted:
            self._count("preempted", len(meta.preempted))
        for new in scheduler_output.scheduled_new_reqs:
            verify = self._verifying.pop(new.req_id, 0)
            self._tracked[new.req_id] = Tracked(
                list(new.prompt_token_ids or []), [list(g) for g in new.block_ids],
                max(self._loaded.pop(new.req_id, 0), verify), self._salts.pop(new.req_id, ""), verify_chunks=verify,
            )
            done = new.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            self._plan(new.req_id, done, meta, new.num_computed_tokens)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = [list(g) for g in new_blocks] if new_blocks else [[] for _ in tracked.block_ids]
            elif new_blocks:
                for mine, more in zip(tracked.block_ids, new_blocks):
                    mine.extend(more)
            done = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            self._plan(req_id, done, meta, cached.num_computed_tokens[i])
        return meta

    def _plan(self, req_id: str, computed: int, meta: KVStoreConnectorMetadata, before: int) -> None:
        """Plan the saves (and comparisons) of the chunks `req_id` completes in this step; `before`: the
        tokens it had computed before it (vLLM may have freed blocks behind a sliding window at them)."""
        tracked = self._tracked[req_id]
        assert self._geometry is not None
        t = self._chunk_tokens
        ready = min(computed, len(tracked.prompt)) // t
        if self._save_enabled and ready > tracked.saved_chunks:
            first = self._geometry.valid_chunks(tracked.block_ids, tracked.saved_chunks, ready, before)
            if first > tracked.saved_chunks:
                self._count("chunks_not_held", first - tracked.saved_chunks)
            if ready > first:
                meta.saves.append(SaveSpec(req_id, tracked.prompt[: ready * t], tracked.block_ids, first,
                                           ready - first, tracked.salt))
                tracked.saving = True
                self._count("save_specs")
            tracked.saved_chunks = ready
        compared = min(ready, tracked.verify_chunks)
        if compared > tracked.verified_chunks:
            first = tracked.verified_chunks
            meta.saves.append(SaveSpec(req_id, tracked.prompt[: compared * t], tracked.block_ids, first,
                                       compared - first, tracked.salt, verify=True))
            tracked.verified_chunks = compared
            tracked.saving = True  # the comparison reads the blocks: they outlive the request until it is done
            self._count("verify_specs")

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        tracked = self._tracked.pop(rid, None)
        for state in (self._lookups, self._unasked, self._salts, self._loads, self._loaded, self._async,
                      self._verifying):
            state.pop(rid, None)
        delay = tracked is not None and tracked.saving and self._save_async
        if delay:
            self._count("delayed_frees")
        return delay, None

    def request_finished_all_groups(self, request: "Request", block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, list(block_ids[0]) if block_ids else [])

    # -- worker side -------------------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if not self._enabled:
            return
        g = self._geometry
        assert g is not None
        missing = [n for group in g.groups for n in group.layer_names if n not in kv_caches]
        if missing:
            self._disable(f"no KV cache for layers {missing[:3]}")
            return
        num_blocks = self._kv_cache_config.num_blocks
        first = kv_caches[g.groups[0].layer_names[0]]
        self._ratio = max(1, first.shape[0] // num_blocks) if num_blocks else 1
        try:  # one set of block planes per KV cache group (each group has its own block table)
            kvs = [PagedKV.from_blocks([kv_caches[n] for n in group.layer_names], group.block_size // self._ratio)
                   for group in g.groups]
        except ValueError as exc:
            self._disable(str(exc))
            return
        held = sum(len(kv.rows) * kv.row_bytes * self._ratio * (self._chunk_tokens // group.block_size)
                   for kv, group in zip(kvs, g.groups))
        if held != g.paged.chunk_nbytes:
            self._disable(f"the caches hold {held} bytes a chunk, the KV cache spec says {g.paged.chunk_nbytes}")
            return
        rank = tp_rank(self._vllm_config)
        self._saves_here = self._save_enabled and not (g.mla and rank != 0)  # MLA: rank 0 saves for every rank
        connect = {"pin_arena": True, "gpu": bool(self._extra.get("gpu_tier", True))} if first.device.type == "cuda" else {}
        self._transfers = Transfers(kvs, self._chunk_store(rank, self._link(**connect)),
                                    self._chunk_store(rank, self._link(**connect)),
                                    int(self._extra.get("max_save_bytes", 1 << 30)), dtype=first.dtype)

    def _disable(self, why: str) -> None:
        log.warning("kvstore connector disabled: %s", why)
        self._geometry = None

    def _chunk_blocks(self, block_ids: list[list[int]], skip_tokens: int = 0):
        """Chunk index -> per KV cache group, the kernel block ids that chunk fills (see `chunk_blocks`)."""
        g = self._geometry
        assert g is not None
        return lambda chunk: g.chunk_blocks(block_ids, chunk, skip_tokens, self._ratio)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        if self._transfers is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVStoreConnectorMetadata)
        for spec in meta.loads:
            job = LoadJob(spec.req_id, spec.token_ids, spec.salt, spec.skip_tokens // self._chunk_tokens,
                          spec.num_chunks, self._chunk_blocks(spec.block_ids, spec.skip_tokens))
            if spec.is_async:
                self._loading[spec.req_id] = spec
                self._transfers.submit_load(job)
            else:
                self._note_load(spec, self._transfers.run_load(job))

    def _note_load(self, spec: LoadSpec, job: LoadJob) -> None:
        """Report the blocks a load left unwritten, in every group (vLLM recomputes them)."""
        blocks = self._chunk_blocks(spec.block_ids, spec.skip_tokens)
        for chunk in range(job.first_chunk + job.loaded, spec.num_chunks):
            self._load_errors.update(b // self._ratio for group in blocks(chunk) for b in group if b >= 0)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # synchronous loads are complete before the forward; asynchronous ones are not in this step

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata", **kwargs: Any
    ) -> None:
        return  # the step's saves are queued whole in wait_for_save

    def wait_for_save(self) -> None:
        if self._transfers is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVStoreConnectorMetadata) and self._geometry is not None
        if not meta.saves:
            return
        ready = None
        if self._transfers.kv.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self._transfers.kv.device))
        for spec in meta.saves:
            job = SaveJob(spec.req_id, spec.token_ids, spec.salt, spec.first_chunk, spec.num_chunks,
                          self._chunk_blocks(spec.block_ids), spec.num_chunks * self._geometry.paged.chunk_nbytes,
                          ready, verify=spec.verify)
            if self._save_async:
                self._saving.add(spec.req_id)  # reported sent once done (at once by a rank that does not save)
                if self._saves_here:
                    self._transfers.submit_save(job)
            elif self._saves_here:
                self._transfers.run_save(job)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self._transfers is not None and isinstance(kv_connector_metadata, KVStoreConnectorMetadata):
            self._transfers.settle(kv_connector_metadata.preempted)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._transfers is None:
            return None, None
        received = set()
        for job in self._transfers.collect().loads:
            spec = self._loading.pop(job.req_id, None)
            if spec is not None:
                self._note_load(spec, job)
                received.add(job.req_id)
        self._finishing |= finished_req_ids & self._saving
        sent = {rid for rid in self._finishing if not self._transfers.saving(rid)}
        self._finishing -= sent
        self._saving -= sent
        return sent or None, received or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    @property
    def stats(self) -> dict[str, int]:
        """What this side has done: lookups and plans (scheduler), chunks moved and dropped (worker)."""
        moved = self._transfers.counters.as_dict() if self._transfers is not None else {}
        return {**self._stats, **moved}

    def shutdown(self) -> None:
        if self._transfers is not None:
            self._transfers.close()
        for link in self._links:
            link.close()
        if self._off_report is not None:
            self._off_report.close()
