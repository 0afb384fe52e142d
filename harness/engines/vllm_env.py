"""Drive the vLLM connector the way vLLM 0.33's scheduler and workers do, with vLLM's own records: an engine in
the calling process, no model and no vLLM engine virtualenv (the `vllm` wheel the connector tests import).

Caches are vLLM's per-layer views (`create_kv_cache_views`) over one flat buffer, in a layout whose physical
order differs from the logical [blocks, heads, block_size, 2 * head_dim]; requests, scheduler output and
per-step records are vLLM's classes. The "forward" writes given K and V into the request's blocks the way
attention does (through a per-token slot mapping), so the connector is checked against an independent writer.

Loads are asynchronous as in vLLM: a request with external hits is first admitted (`admit`: blocks for the
prefix, a step whose metadata carries the load), waits until a step's `get_finished` reports it received
(`wait_loaded`), and is then scheduled as a new request with the loaded tokens computed. Saves finish in the
background; `drain` steps until they have.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.config import CacheConfig, KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, create_kv_cache_views,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.request import Request

from kvstore.connectors.vllm import KVStoreConnector

BLOCK = 16
OPEN: list["Engine"] = []  # engines not closed yet (`close_all` at the end of a test)


def layer_names(n: int) -> list[str]:
    return [f"model.layers.{i}.self_attn.attn" for i in range(n)]


def kv_cache_config(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, num_blocks: int):
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=kv_heads, head_size=head_dim, dtype=dtype)
    page = spec.page_size_bytes
    tensor = KVCacheTensor(size=page * num_blocks * layers, layers=layer_names(layers),
                           layer_stride=page * num_blocks, block_stride=page)
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[tensor],
                         kv_cache_groups=[KVCacheGroupSpec(layer_names(layers), spec)]), spec, tensor


def vllm_config(address: str, chunk_tokens: int, role: str = "kv_both", **extra) -> VllmConfig:
    transfer = KVTransferConfig(
        kv_connector="KVStoreConnector", kv_connector_module_path="kvstore.connectors.vllm", kv_role=role,
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"address": address, "chunk_tokens": chunk_tokens, "model_id": "tiny-llama",
                                   "timeout": 2.0, "load_async": True, **extra},
    )
    return VllmConfig(kv_transfer_config=transfer, cache_config=CacheConfig(block_size=BLOCK))


@dataclass
class Engine:
    """One engine instance: a scheduler-side and a worker-side connector over fresh paged caches."""

    address: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32
    chunk_tokens: int = 256
    num_blocks: int = 160
    device: str = "cpu"
    extra: dict = field(default_factory=dict)
    seed: int = 0
    role: str = "kv_both"

    def __post_init__(self):
        config = vllm_config(self.address, self.chunk_tokens, self.role, **self.extra)
        self.kv_config, spec, tensor = kv_cache_config(self.layers, self.kv_heads, self.head_dim, self.dtype,
                                                       self.num_blocks)
        raw = torch.zeros(tensor.size, dtype=torch.int8, device=self.device)
        # LBNHC: each block is [block_size, heads, 2 * head_dim] in memory, unlike the logical view
        views = create_kv_cache_views(raw, spec, self.num_blocks, KVCacheLayout.LBNHC, tensor)
        self.caches = dict(zip(layer_names(self.layers), views))
        self.scheduler = KVStoreConnector(config, KVConnectorRole.SCHEDULER, self.kv_config)
        self.worker = KVStoreConnector(config, KVConnectorRole.WORKER, self.kv_config)
        self.worker.register_kv_caches(self.caches)
        self.free = list(range(self.num_blocks))
        random.Random(self.seed).shuffle(self.free)  # requests get scattered, non-contiguous blocks
        self.blocks: dict[str, list[int]] = {}
        self.seen: set[str] = set()
        self.load_errors: set[int] = set()
        self.sent: set[str] = set()
        self.received: set[str] = set()
        self.admitted: dict[str, int] = {}  # req id -> external tokens loaded asynchronously
        OPEN.append(self)
        self.is_async: dict[str, bool] = {}  # req id -> what the connector said of its load

    def allocate(self, req_id: str, upto_tokens: int) -> list[int]:
        have = self.blocks.setdefault(req_id, [])
        new = [self.free.pop() for _ in range(-(-upto_tokens // BLOCK) - len(have))]
        have.extend(new)
        return new

    def write_kv(self, req_id: str, keys: list[torch.Tensor], values: list[torch.Tensor], start: int, end: int):
        """What attention does: write tokens [start, end) of K/V ([1, H, S, D] per layer) through slots."""
        table = torch.tensor(self.blocks[req_id])
        pos = torch.arange(start, end)
        slots = table[pos // BLOCK] * BLOCK + pos % BLOCK
        for name, k, v in zip(self.caches, keys, values):
            cache = self.caches[name]
            _, _, bs, _ = cache.shape
            for t, slot in zip(range(start, end), slots.tolist()):  # deliberately the slow, obvious way
                cache[slot // bs, :, slot % bs, : self.head_dim] = k[0, :, t].to(cache.device)
                cache[slot // bs, :, slot % bs, self.head_dim:] = v[0, :, t].to(cache.device)

    def read_kv(self, req_id: str, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer [1, H, end, D] K and V of a request's first `end` tokens, read token by token."""
        table = self.blocks[req_id]
        keys, values = [], []
        for cache in self.caches.values():
            rows = torch.stack([cache[table[t // BLOCK], :, t % BLOCK] for t in range(end)], dim=1)  # [H, end, 2D]
            keys.append(rows[None, ..., : self.head_dim].cpu())
            values.append(rows[None, ..., self.head_dim:].cpu())
        return keys, values

    def lookup(self, request: Request, local_tokens: int = 0) -> int:
        if request.request_id not in self.seen:
            self.seen.add(request.request_id)
            self.scheduler.on_new_request(request)
        ext, is_async = self.scheduler.get_num_new_matched_tokens(request, local_tokens)
        assert is_async is False or ext > 0
        self.is_async[request.request_id] = is_async
        return ext

    def _kv_blocks(self, req_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(([KVCacheBlock(b) for b in self.blocks[req_id]],))

    def admit(self, request: Request, local_tokens: int, ext_tokens: int):
        """vLLM's first allocation for an asynchronous load: blocks for the prefix; returns the step's metadata."""
        self.allocate(request.request_id, local_tokens + ext_tokens)
        self.scheduler.update_state_after_alloc(request, self._kv_blocks(request.request_id), ext_tokens)
        self.admitted[request.request_id] = ext_tokens
        return self.scheduler.build_connector_meta(SchedulerOutput.make_empty())

    def wait_loaded(self, req_id: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while req_id not in self.received:
            assert time.monotonic() < deadline, f"load of {req_id} never finished"
            self.run_step(self.scheduler.build_connector_meta(SchedulerOutput.make_empty()))
            time.sleep(0.005)

    def schedule_new(self, request: Request, local_tokens: int, ext_tokens: int, num_tokens: int):
        """Allocate, notify the connector, and build the step's metadata for a new request (after its
        asynchronous load, which this runs first unless `admit` already did)."""
        rid = request.request_id
        asynchronous = ext_tokens > 0 and self.is_async.get(rid, False)
        if asynchronous and rid not in self.admitted:
            self.last_load_meta = self.admit(request, local_tokens, ext_tokens)
            self.run_step(self.last_load_meta)
        if asynchronous:
            self.wait_loaded(rid)
        computed = local_tokens + ext_tokens
        self.allocate(rid, computed + num_tokens)
        self.scheduler.update_state_after_alloc(request, self._kv_blocks(rid), 0 if asynchronous else ext_tokens)
        new = NewRequestData.from_request(request, (list(self.blocks[rid]),))
        new.num_computed_tokens = computed
        out = SchedulerOutput.make_empty()
        out.scheduled_new_reqs = [new]
        out.num_scheduled_tokens = {rid: num_tokens}
        out.total_num_scheduled_tokens = num_tokens
        meta = self.scheduler.build_connector_meta(out)
        if not asynchronous:
            self.last_load_meta = meta
        return meta

    def schedule_cached(self, request: Request, computed: int, num_tokens: int):
        new_blocks = self.allocate(request.request_id, computed + num_tokens)
        out = SchedulerOutput.make_empty()
        out.scheduled_cached_reqs = CachedRequestData(
            req_ids=[request.request_id], resumed_req_ids=set(), new_token_ids=[[]], all_token_ids={},
            new_block_ids=[(new_blocks,) if new_blocks else None], num_computed_tokens=[computed],
            num_output_tokens=[0],
        )
        out.num_scheduled_tokens = {request.request_id: num_tokens}
        out.total_num_scheduled_tokens = num_tokens
        return self.scheduler.build_connector_meta(out)

    def run_step(self, meta, forward=None, finished: set[str] | None = None):
        """The worker's view of one step: bind, load, forward (per layer: save), save, collect, clear."""
        self.worker.bind_connector_metadata(meta)
        self.worker.handle_preemptions(meta)
        self.worker.start_load_kv(None)
        if forward is not None:
            forward()
        for name, cache in self.caches.items():
            self.worker.wait_for_layer_load(name)
            self.worker.save_kv_layer(name, cache, None)
        self.worker.wait_for_save()
        sent, received = self.worker.get_finished(finished or set())
        self.sent |= sent or set()
        self.received |= received or set()
        self.load_errors |= self.worker.get_block_ids_with_load_errors()
        self.worker.clear_connector_metadata()
        return sent, received

    def drain(self, finished: set[str] | None = None, timeout: float = 10.0) -> None:
        """Step until the background saves (and loads) are done."""
        deadline = time.monotonic() + timeout
        while not self.worker.worker_side.transfers.idle():
            assert time.monotonic() < deadline, "background transfers never finished"
            time.sleep(0.005)
        self.run_step(self.scheduler.build_connector_meta(SchedulerOutput.make_empty()), finished=finished)

    def finish(self, request: Request) -> bool:
        """The request is done: returns whether the connector keeps its blocks (saves in flight)."""
        delay, _ = self.scheduler.request_finished(request, self.blocks[request.request_id])
        return delay


def close_all() -> None:
    """Shut every open engine's connectors down: their clients unmap the daemons' arenas."""
    while OPEN:
        engine = OPEN.pop()
        engine.scheduler.shutdown()
        engine.worker.shutdown()


def request(req_id: str, token_ids: list[int], cache_salt: str | None = None,
            kv_transfer_params: dict | None = None) -> Request:
    """A vLLM request as the engine makes it (`kv_transfer_params` through `SamplingParams.extra_args`)."""
    extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
    return Request(req_id, token_ids, SamplingParams(max_tokens=8, extra_args=extra), None, cache_salt=cache_salt)
