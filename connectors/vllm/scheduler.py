"""The scheduler half of the vLLM connector: which prompt prefixes the daemon holds, what each step loads and saves.

It runs in vLLM's scheduler process (``KVConnectorRole.SCHEDULER``) and never touches KV memory: it looks
requests up, offers vLLM the stored chunks, and sends the workers each step's `KVStoreConnectorMetadata`.
See ``kvstore.connectors.vllm`` for how a request flows.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kvstore.protocol.kv_events import block_hash

from ..common.canonical import CanonicalStore, identity_root, request_root
from ..common.report import state_report
from ..common.store import ChunkStore
from .geometry import NULL_BLOCK
from .identity import AdapterFingerprints, RequestKeys, Unkeyable, WeightsEpoch, extend, request_keys
from .records import KVStoreConnectorMetadata, LoadSpec, SaveSpec, Tracked
from .retention import RequestRetention, request_retention
from .settings import chosen_for_verify
from .shared import ConnectorSettings
from .stats import Interval, KVStoreConnectorStats

if TYPE_CHECKING:
    from ..common.layout import PagedGeometry
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request


NORMAL = RequestRetention()
log = logging.getLogger("kvstore.connectors")


class SchedulerSide:
    """Lookups and the per-step plan of one engine's scheduler (`settings.geometry` must be set)."""

    def __init__(self, settings: ConnectorSettings) -> None:
        g = settings.geometry
        assert g is not None
        self._settings = settings
        self._geometry = g
        self._chunk_tokens = settings.chunk_tokens
        self._load_mode = settings.config.load_async
        self._lookup_batch = settings.config.lookup_batch
        # A hybrid model's state exists only in the step that computed it: none is left to compare later.
        self._verify_fraction = 0.0 if g.hybrid else settings.config.verify_fraction
        self._stats: dict[str, int] = {}
        self._interval = Interval()
        self._unasked: dict[str, "Request"] = {}   # waiting requests not looked up yet
        self._lookups: dict[str, tuple[int, int]] = {}  # req id -> (tokens when asked, chunks found)
        self._keys: dict[str, RequestKeys] = {}     # req id -> its key root and per-chunk extras
        self._refused: set[str] = set()             # requests with an input the connector cannot key
        self._epoch = WeightsEpoch(settings.config.weights_version)
        self._adapters = AdapterFingerprints()
        self._warned_kinds: set[str] = set()
        self._retention: dict[str, RequestRetention] = {}  # req id -> its retention class, read once
        self._by_priority = settings.config.priority_retention
        self._loads: dict[str, LoadSpec] = {}
        self._loaded: dict[str, int] = {}           # req id -> chunks loaded, until the request is tracked
        self._async: dict[str, bool] = {}           # req id -> whether its load was offered as asynchronous
        self._verifying: dict[str, int] = {}        # req id -> stored chunks it computes to compare instead
        self._tracked: dict[str, Tracked] = {}
        self._requests: dict[str, "Request"] = {}   # scheduled requests: their block hashes name saved chunks
        sizes = {group.block_size for group in g.groups}
        # vLLM hashes blocks at one block size; with groups of several (hybrid models) no single one names them
        self._engine_block_size = sizes.pop() if len(sizes) == 1 else 0
        # A local client reads lookups from the daemon's shared index.
        link = settings.link(connector=state_report("vllm", g.family, "on", g.describe()))
        stages: list[tuple[PagedGeometry, str | None]] = list(zip(g.stages, g.stage_labels))
        stages = stages or [(g.paged, None)]
        ranks = [0] if g.mla else range(settings.tp_size)   # an MLA latent is stored once for every rank
        self.stores: list[ChunkStore] = [settings.chunk_store(rank, link, paged, stage)
                                         for paged, stage in stages for rank in ranks]
        link.client()  # connect (and map) now, not on the first request; a daemon that is down: later

    @property
    def stats(self) -> dict[str, int | float]:
        return dict(self._stats)

    def looked_up(self, req_id: str) -> bool:
        """Whether a lookup answer for `req_id` is still kept (until it is scheduled or finished)."""
        return req_id in self._lookups

    def take_stats(self) -> KVStoreConnectorStats:
        """What the scheduler did since the last call: prompt tokens to load from the store, lookups."""
        grown = self._interval.take(self._stats)
        return KVStoreConnectorStats(data={"hit_tokens": grown.get("hit_tokens", 0),
                                           "lookups": grown.get("lookups", 0),
                                           "unkeyable": grown.get("unkeyable", 0)})

    def _count(self, name: str, n: int = 1) -> None:
        self._stats[name] = self._stats.get(name, 0) + n

    def on_new_request(self, request: "Request") -> None:
        if self._settings.load_enabled:
            self._unasked[request.request_id] = request

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        self._read_retention(request)
        if self._keyed(request, request.num_tokens // self._chunk_tokens) is None:
            return 0, False   # an input it cannot key: neither loaded nor saved
        if not self._settings.load_enabled:
            return 0, False
        self._count("asked")
        found = self._lookups.get(request.request_id)
        if found is None or found[0] != request.num_tokens:
            self._look_up(request)
            found = self._lookups[request.request_id]
        # Every family alike, MLA on the CPU too: vLLM computes the tokens after a loaded prefix as a prefill
        # over the cached latents (or, one token left, as a decode), the same arithmetic as over a prefix it
        # computed itself (docs/connectors/model-families.md).
        external = found[1] * self._chunk_tokens - num_computed_tokens
        if external <= 0:
            return 0, False
        if chosen_for_verify(request.request_id, self._verify_fraction):
            self._verifying[request.request_id] = found[1]  # computed as a miss, compared once computed
            return 0, False
        # Off the step when other requests run (they keep going while this one waits for its KV); in the step
        # when the engine is idle, where it saves the steps an asynchronous load waits for its report.
        asynchronous = self._load_mode == "async" or (self._load_mode == "auto" and bool(self._tracked))
        self._async[request.request_id] = asynchronous
        return external, asynchronous

    def _read_retention(self, request: "Request") -> None:
        """Read `request`'s retention class from its ``kv_transfer_params`` (once: a warning at most once)."""
        rid = request.request_id
        if rid not in self._retention:
            self._retention[rid] = request_retention(getattr(request, "kv_transfer_params", None), rid,
                                                     getattr(request, "priority", None), self._by_priority)

    def saves_allowed(self, req_id: str) -> bool:
        """Whether the connector may save what `req_id` computes (saving on, its retention class allows it, and
        every input of it is keyed)."""
        return (self._settings.save_enabled and self._retention.get(req_id, NORMAL).cls.saves
                and req_id not in self._refused)

    def _keyed(self, request: "Request", chunks: int) -> RequestKeys | None:
        """`request`'s key root and the extras of its first `chunks` chunks (made once, extended on demand);
        None for a request with an input the connector cannot key (counted, logged once per kind)."""
        rid = request.request_id
        if rid in self._refused:
            return None
        try:
            keys = self._keys.get(rid)
            if keys is None:
                keys = self._keys[rid] = request_keys(request, self._chunk_tokens, chunks,
                                                      self._settings.model_identity, self._epoch, self._adapters)
            else:
                extend(keys, request, self._chunk_tokens, chunks)
            return keys
        except Unkeyable as exc:
            self._keys.pop(rid, None)
            self._refused.add(rid)
            self._count("unkeyable")
            self._count(f"unkeyable_{exc.kind}")
            if exc.kind not in self._warned_kinds:
                self._warned_kinds.add(exc.kind)
                log.warning("kvstore neither loads nor saves requests with an input it cannot key (%s); "
                            "counted under unkeyable", exc)
            return None

    @property
    def session_namespace(self) -> str:
        """The namespace this engine's chunks are stored in (a client looking them up says hello with it)."""
        return self._settings.session_namespace

    @property
    def key_scheme(self) -> str:
        """The key scheme this engine's chunk keys are made by (a client reaching them says it at hello)."""
        return self._settings.key_scheme

    def plain_keys(self, store: ChunkStore, token_ids: list[int], cache_salt: str = "") -> list[bytes]:
        """The keys `store` holds a prompt of plain token ids under (no adapter or multimodal input) in this
        engine's current weights epoch: what an operator's tool or a test looks up or deletes."""
        root = request_root(cache_salt or None, identity_root(self._settings.model_identity, self._epoch.current))
        return store.keys(token_ids, root)

    def reset_cache(self) -> bool:
        """Forget every chunk saved before now (vLLM's ``reset_prefix_cache(reset_connector=True)``, after the
        weights were updated in place): a new weights epoch in every key root, so nothing saved before is found,
        and nothing is deleted (other engines' chunks stay theirs). Requests already running save no more (their
        KV may straddle the update); waiting ones are looked up again under the new epoch."""
        self._epoch.reset()
        self._lookups.clear()
        self._keys.clear()
        for tracked in self._tracked.values():
            tracked.stale = True
        self._count("resets")
        return True

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
        keyed = {rid: self._keyed(batch[rid], hits[rid]) for rid in batch}
        for rid, keys in keyed.items():
            if keys is None:
                hits[rid] = 0
        for store in self.stores:
            asked = [rid for rid in batch if hits[rid] > 0]
            chains = []
            for rid in asked:
                keys = keyed[rid]
                assert keys is not None
                chains.append(store.keys(prompts[rid][: hits[rid] * t], keys.root, keys.upto(hits[rid])))
            counts = store.lookup_many(chains)
            self._count("lookup_calls")
            for rid, count in zip(asked, counts):
                if count < hits[rid] and isinstance(store, CanonicalStore):   # heads another TP size wrote
                    keys = keyed[rid]
                    assert keys is not None
                    whole = store.chunk_keys_of(prompts[rid][: hits[rid] * t], keys.root, keys.upto(hits[rid]))
                    count = store.lookup_any(whole, known=count)
                hits[rid] = count
        for rid, r in batch.items():
            self._lookups[rid] = (r.num_tokens, hits[rid])
            self._unasked.pop(rid, None)
        self._count("lookups", len(batch))

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        rid = request.request_id
        self._requests[rid] = request
        found = self._lookups.pop(rid, None)
        self._unasked.pop(rid, None)
        if num_external_tokens <= 0 or found is None or found[1] <= 0:
            return
        chunks = found[1]
        keys = self._keys.get(rid)
        if keys is None:
            return
        end = chunks * self._chunk_tokens
        block_ids = [[NULL_BLOCK if b.is_null else b.block_id for b in group] for group in blocks.blocks]
        self._loads[rid] = LoadSpec(rid, list(request.all_token_ids[:end]), block_ids, chunks,
                                    end - num_external_tokens, keys.root, self._async.pop(rid, True),
                                    extras=keys.upto(chunks))
        self._loaded[rid] = chunks
        self._count("load_specs")
        self._count("hit_tokens", num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVStoreConnectorMetadata:
        meta = KVStoreConnectorMetadata()
        meta.loads, self._loads = list(self._loads.values()), {}
        meta.preempted = list(getattr(scheduler_output, "preempted_req_ids", None) or ())
        if meta.preempted:
            self._count("preempted", len(meta.preempted))
        for new in scheduler_output.scheduled_new_reqs:
            verify = self._verifying.pop(new.req_id, 0)
            self._tracked[new.req_id] = self._track(new, verify)
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

    def _track(self, new: Any, verify: int) -> Tracked:
        """The scheduler's record of a newly scheduled request: its prompt (as vLLM holds it: prompt embeddings'
        positions are zeros), blocks, and the key root and extras its chunks are saved under."""
        request = self._requests.get(new.req_id)
        prompt = (list(request.all_token_ids[: request.num_prompt_tokens]) if request is not None
                  else list(new.prompt_token_ids or []))
        keys = self._keyed(request, len(prompt) // self._chunk_tokens) if request is not None else None
        tracked = Tracked(prompt, [list(g) for g in new.block_ids], max(self._loaded.pop(new.req_id, 0), verify),
                          keys.root if keys is not None else "", verify_chunks=verify,
                          extras=keys.upto(len(prompt) // self._chunk_tokens) if keys is not None else [])
        tracked.stale = keys is None   # an input it cannot key: nothing of it is saved
        return tracked

    def _plan(self, req_id: str, computed: int, meta: KVStoreConnectorMetadata, before: int) -> None:
        """Plan the saves (and comparisons) of the chunks `req_id` completes in this step; `before`: the
        tokens it had computed before it (vLLM may have freed blocks behind a sliding window at them)."""
        tracked = self._tracked[req_id]
        if tracked.stale:
            return
        t = self._chunk_tokens
        ready = min(computed, len(tracked.prompt)) // t
        if ready > tracked.saved_chunks and self.saves_allowed(req_id):
            first = self._geometry.valid_chunks(tracked.block_ids, tracked.saved_chunks, ready, before, computed)
            if first > tracked.saved_chunks:
                self._count("chunks_not_held", first - tracked.saved_chunks)
            if ready > first:
                kept = self._retention.get(req_id, NORMAL)
                spec = SaveSpec(req_id, tracked.prompt[: ready * t], tracked.block_ids, first, ready - first,
                                tracked.salt, retention=kept.cls.value, pin_ttl=kept.pin_ttl,
                                extras=tracked.extras[:ready])
                self._name_engine_blocks(spec)
                meta.saves.append(spec)
                tracked.saving = True
                self._count("save_specs")
            tracked.saved_chunks = ready
        compared = min(ready, tracked.verify_chunks)
        if compared > tracked.verified_chunks:
            first = tracked.verified_chunks
            meta.saves.append(SaveSpec(req_id, tracked.prompt[: compared * t], tracked.block_ids, first,
                                       compared - first, tracked.salt, verify=True,
                                       extras=tracked.extras[:compared]))
            tracked.verified_chunks = compared
            tracked.saving = True  # the comparison reads the blocks: they outlive the request until it is done
            self._count("verify_specs")

    def _name_engine_blocks(self, spec: SaveSpec) -> None:
        """Add vLLM's block hashes of the chunks ``spec`` saves (as integers, vLLM's reduction), when vLLM has
        hashed every one of their blocks."""
        size, request = self._engine_block_size, self._requests.get(spec.req_id)
        if request is None or size <= 0 or self._chunk_tokens % size:
            return
        per = self._chunk_tokens // size
        start, end = spec.first_chunk * per, (spec.first_chunk + spec.num_chunks) * per
        hashes = getattr(request, "block_hashes", None) or ()
        if len(hashes) < end:
            return
        spec.engine_hashes = [_as_int(h) for h in hashes[start:end]]
        spec.engine_parent = _as_int(hashes[start - 1]) if start else None
        spec.engine_block_size = size

    def request_finished(self, request: "Request") -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        self._requests.pop(rid, None)
        tracked = self._tracked.pop(rid, None)
        for state in (self._lookups, self._unasked, self._keys, self._retention, self._loads, self._loaded,
                      self._async, self._verifying):
            state.pop(rid, None)
        self._refused.discard(rid)
        delay = tracked is not None and tracked.saving and self._settings.save_async
        if delay:
            self._count("delayed_frees")
        return delay, None


def _as_int(h: Any) -> int:
    """A vLLM block hash as the integer its KV cache events carry (the last 8 bytes, big-endian)."""
    return h & ((1 << 64) - 1) if isinstance(h, int) else block_hash(bytes(h))
