"""The worker half of the vLLM connector: the engine's KV caches, and the loads and saves each step asks for.

It runs in each vLLM worker (``KVConnectorRole.WORKER``): `register_kv_caches` finds the block planes of every
KV cache group, and each step's `KVStoreConnectorMetadata` (from the scheduler half) becomes load and save jobs
for `_transfers.Transfers`. See ``kvstore.connectors.vllm`` for how a request flows.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

import torch

from kvstore.ops import PagedKV
from kvstore.protocol.engine_blocks import EngineBlocks

from ..common.block_codec import BlockCodec
from ..common.transfers import LoadJob, SaveJob, Transfers
from .geometry import CPU_KERNELS, EngineGeometry, cpu_kernels
from .hybrid import state_rows, state_target
from .records import KVStoreConnectorMetadata, LoadSpec, SaveSpec
from .settings import tp_rank
from .shared import ConnectorSettings
from .stats import Interval, KVStoreConnectorStats

if TYPE_CHECKING:
    from vllm.config import VllmConfig

log = logging.getLogger("kvstore.connectors.vllm")


class WorkerSide:
    """Loads into and saves out of one worker's KV caches (`settings.geometry` must be set)."""

    def __init__(self, settings: ConnectorSettings, vllm_config: "VllmConfig", num_blocks: int) -> None:
        assert settings.geometry is not None
        self._settings = settings
        self._geometry = settings.geometry
        self._vllm_config = vllm_config
        self._num_blocks = num_blocks
        self.transfers: Transfers | None = None      # set once the caches are registered
        self._ratios: list[int] = [1] * len(settings.geometry.groups)   # kernel blocks per vLLM block, per group
        self._loading: dict[str, LoadSpec] = {}      # asynchronous loads in flight
        self._saving: set[str] = set()               # requests with saves planned (their blocks are kept)
        self._finishing: set[str] = set()            # ... that finished, waiting for their saves
        self._load_errors: set[int] = set()
        self._refused: set[str] = set()              # asynchronous loads refused (reported done, nothing written)
        self._saves_here = False                     # this worker saves (MLA under TP: rank 0 only)
        self._interval = Interval()

    @property
    def stats(self) -> dict[str, int | float]:
        return self.transfers.counters.as_dict() if self.transfers is not None else {}

    def take_stats(self) -> KVStoreConnectorStats:
        """What this worker moved since the last call (chunks, bytes, failures, seconds)."""
        grown = self._interval.take(self.stats)
        nbytes = self._geometry.paged.chunk_nbytes
        return KVStoreConnectorStats(data={
            "loaded_chunks": grown.get("chunks_loaded", 0), "loaded_bytes": grown.get("chunks_loaded", 0) * nbytes,
            "load_failures": grown.get("load_failures", 0), "saved_chunks": grown.get("chunks_saved", 0),
            "saved_bytes": grown.get("chunks_saved", 0) * nbytes, "saves_dropped": grown.get("saves_dropped", 0),
            "save_failures": grown.get("save_failures", 0), "load_seconds": grown.get("load_seconds", 0.0),
            "save_seconds": grown.get("save_seconds", 0.0)})

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Find every group's block planes; on a cache that does not match the geometry, log one line and stay off."""
        g, s = self._geometry, self._settings
        missing = [n for group in g.groups for n in group.layer_names if n not in kv_caches]
        if missing:
            return self._disable(f"no KV cache for layers {missing[:3]}")
        first = kv_caches[g.groups[0].layer_names[0]]
        # kernel blocks per vLLM block, per group (attention kernels may split a block; state pages never do)
        self._ratios = [max(1, kv_caches[group.layer_names[0]].shape[0] // self._num_blocks) if self._num_blocks
                        else 1 for group in g.groups]
        try:  # one set of block planes per KV cache group (each group has its own block table)
            kvs = [PagedKV.from_blocks([state_rows(kv_caches[n], group.page_bytes) for n in group.layer_names], 1)
                   if group.holds_state else  # a state: one row a block, whatever its tokens
                   PagedKV.from_blocks([kv_caches[n] for n in group.layer_names], group.block_size // ratio)
                   for group, ratio in zip(g.groups, self._ratios)]
        except ValueError as exc:
            return self._disable(str(exc))
        held = sum(len(kv.rows) * kv.row_bytes * ratio * (s.chunk_tokens // group.block_size)
                   for kv, group, ratio in zip(kvs, g.groups, self._ratios))
        if held != g.paged.chunk_nbytes:
            return self._disable(f"the caches hold {held} bytes a chunk, the KV cache spec says {g.paged.chunk_nbytes}")
        codec = None
        if g.canonical is not None:   # chunks in the canonical layout: K and V of this rank's heads
            try:
                layers = [kv_caches[n] for n in g.groups[0].layer_names]
                codec = BlockCodec(layers, block_content(self._vllm_config, g.groups[0].layer_names[0], layers[0]))
            except ValueError as exc:
                return self._disable(f"canonical chunks: {exc}")
            if codec.heads != g.kv_heads or codec.head_dim != g.canonical.head_dim:
                return self._disable(f"the caches hold {codec.heads} heads of {codec.head_dim}, the KV cache spec "
                                     f"{g.kv_heads} of {g.canonical.head_dim}")
        rank = tp_rank(self._vllm_config)
        self._saves_here = s.save_enabled and not (g.mla and rank != 0)  # MLA: rank 0 saves for every rank
        gpu = first.device.type == "cuda"
        connect = {"pin_arena": True, "gpu": s.config.gpu_tier} if gpu else {}
        self.transfers = Transfers(kvs, s.chunk_store(rank, s.link(**connect)), s.chunk_store(rank, s.link(**connect)),
                                   s.config.max_save_bytes, dtype=first.dtype, codec=codec)

    def _disable(self, why: str) -> None:
        log.warning("kvstore connector disabled: %s", why)
        self.transfers = None

    def _chunk_blocks(self, block_ids: list[list[int]], skip_tokens: int = 0,
                      state_chunk: int | None = None) -> Callable[[int], list[list[int]]]:
        """Chunk index -> per KV cache group, the kernel block ids that chunk fills (see `chunk_blocks`;
        `state_chunk`: a load's last chunk, whose recurrent state it writes)."""
        g = self._geometry
        return lambda chunk: g.chunk_blocks(block_ids, chunk, skip_tokens, self._ratios, state_chunk)

    def start_load_kv(self, meta: KVStoreConnectorMetadata) -> None:
        if self.transfers is None:
            return
        t = self._settings.chunk_tokens
        for spec in meta.loads:
            job = LoadJob(spec.req_id, spec.token_ids, spec.salt, spec.skip_tokens // t,
                          spec.num_chunks, self._load_blocks(spec), extras=list(spec.extras))
            if self._geometry.hybrid and not has_state_target(self._geometry, spec):
                log.warning("kvstore load of request %s refused: no block to write its recurrent state into",
                            spec.req_id)
                self._note_load(spec, job)   # nothing written: vLLM recomputes the prefix
                if spec.is_async:
                    self._loading[spec.req_id] = spec
                    self._refused.add(spec.req_id)
                continue
            if spec.is_async:
                self._loading[spec.req_id] = spec
                self.transfers.submit_load(job)
            else:
                self._note_load(spec, self.transfers.run_load(job))

    def _load_blocks(self, spec: LoadSpec) -> Callable[[int], list[list[int]]]:
        """The blocks each chunk of a load fills (a hybrid model's state: the last chunk's only)."""
        return self._chunk_blocks(spec.block_ids, spec.skip_tokens,
                                  spec.num_chunks - 1 if self._geometry.hybrid else None)

    def _note_load(self, spec: LoadSpec, job: LoadJob) -> None:
        """Report the blocks a load left unwritten, in every group (vLLM recomputes them)."""
        blocks = self._load_blocks(spec)
        for chunk in range(job.first_chunk + job.loaded, spec.num_chunks):
            self._load_errors.update(b // ratio for group, ratio in zip(blocks(chunk), self._ratios)
                                     for b in group if b >= 0)

    def wait_for_save(self, meta: KVStoreConnectorMetadata) -> None:
        if self.transfers is None or not meta.saves:
            return
        ready = None
        if self.transfers.kv.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.transfers.kv.device))
        for spec in meta.saves:
            job = SaveJob(spec.req_id, spec.token_ids, spec.salt, spec.first_chunk, spec.num_chunks,
                          self._chunk_blocks(spec.block_ids), spec.num_chunks * self._geometry.paged.chunk_nbytes,
                          ready, verify=spec.verify, engine=engine_blocks_of(spec, self._settings.chunk_tokens),
                          retention=spec.retention, pin_ttl=spec.pin_ttl, extras=list(spec.extras))
            if self._settings.save_async:
                self._saving.add(spec.req_id)  # reported sent once done (at once by a rank that does not save)
                if self._saves_here:
                    self.transfers.submit_save(job)
            elif self._saves_here:
                self.transfers.run_save(job)

    def handle_preemptions(self, meta: KVStoreConnectorMetadata) -> None:
        if self.transfers is not None:
            self.transfers.settle(meta.preempted)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self.transfers is None:
            return None, None
        received, self._refused = set(self._refused), set()
        for rid in received:
            self._loading.pop(rid, None)
        for job in self.transfers.collect().loads:
            spec = self._loading.pop(job.req_id, None)
            if spec is not None:
                self._note_load(spec, job)
                received.add(job.req_id)
        self._finishing |= finished_req_ids & self._saving
        sent = {rid for rid in self._finishing if not self.transfers.saving(rid)}
        self._finishing -= sent
        self._saving -= sent
        return sent or None, received or None

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def close(self) -> None:
        if self.transfers is not None:
            self.transfers.close()


# vLLM 0.32's attention backends by where K and V lie in a block (``layout.BlockCodec``)
SPLIT_BACKENDS = frozenset({"FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"})


def block_content(vllm_config: "VllmConfig", layer_name: str, cache: torch.Tensor) -> str:
    """Where the attention backend of `layer_name` keeps K and V in a block of `cache`: "cpu" for vLLM's CPU
    backend with its ``vec`` kernels, "split" for the GPU backends (K in the first half of a token's content). A
    layer without a backend (vLLM's unit harnesses, which write the content split) is "split".

    Raises:
        ValueError: a backend, or CPU kernel set, whose block content this connector does not know.
    """
    context = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None) or {}
    backend = getattr(context.get(layer_name), "attn_backend", None)
    if backend is None:
        return "split"
    name = backend.get_name()
    if name == "CPU_ATTN":
        kernels = cpu_kernels(cache.dtype, cache.shape[2], cache.shape[3] // 2)
        if kernels not in CPU_KERNELS:
            raise ValueError(f"vLLM's CPU attention with its {kernels!r} kernels keeps K and V in a block in a way "
                             "this connector does not know")
        return "cpu"
    if name in SPLIT_BACKENDS:
        return "split"
    raise ValueError(f"the {name} attention backend keeps K and V in a block in a way this connector does not know")


def has_state_target(geometry: EngineGeometry, spec: LoadSpec) -> bool:
    """Whether every recurrent-state group of a hybrid model has a block for the load's last chunk's state."""
    return all(state_target(ids, spec.num_chunks - 1) is not None
               for group, ids in zip(geometry.groups, spec.block_ids) if group.holds_state)


def engine_blocks_of(spec: SaveSpec, chunk_tokens: int) -> list[EngineBlocks | None] | None:
    """The engine's names of the blocks of each chunk ``spec`` saves (None when the scheduler sent none, or
    they do not cover every block of those chunks)."""
    size = spec.engine_block_size
    if spec.verify or size <= 0 or chunk_tokens % size:
        return None
    per = chunk_tokens // size
    if len(spec.engine_hashes) != per * spec.num_chunks:
        return None
    out: list[EngineBlocks | None] = []
    parent = spec.engine_parent
    for i in range(spec.num_chunks):
        hashes = tuple(spec.engine_hashes[i * per:(i + 1) * per])
        start = (spec.first_chunk + i) * chunk_tokens
        out.append(EngineBlocks(size, hashes, parent, tuple(spec.token_ids[start:start + chunk_tokens])))
        parent = hashes[-1]
    return out
