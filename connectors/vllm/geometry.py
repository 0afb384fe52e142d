"""vLLM's KV cache groups -> what one kvstore chunk holds, how it is named, and which blocks it moves.

vLLM describes its paged cache as `kv_cache_groups`: layers sharing one block table, each group with a spec
(`FullAttentionSpec`, `SlidingWindowSpec`, `ChunkedLocalAttentionSpec`, `MLAAttentionSpec`, `MambaSpec`...).
The connector copies blocks as the engine stores them (`kvstore.ops` block planes), so a chunk of
`chunk_tokens` tokens is, group after group in the engine's order, every layer's `chunk_tokens / block_size`
blocks of that group. What the CPU build (0.32) reports, measured with small random-weight models:

* dense (Llama, Qwen): one `FullAttentionSpec` group, per-layer caches `[blocks, kv_heads, block, 2 * head]`;
* Gemma-3-shaped (three sliding-window layers of window 64, one full layer): four groups, one per layer, three
  `SlidingWindowSpec` and one `FullAttentionSpec`, each with its own block table; a sliding group's blocks
  behind the window are the null block (id 0) and are freed while the request runs;
* DeepSeek-V2-shaped (MLA, `kv_lora_rank` 512 + `qk_rope_head_dim` 64): one `MLAAttentionSpec` group of one
  576-wide head, caches `[blocks, 1, 16, 576]`. Every tensor-parallel rank holds the same latent, so the
  namespace names no rank (`tp=replicated`): rank 0 saves, every rank loads the same chunks.

Because one chunk holds every group, a prefix is stored for every group or for none: a lookup hit is a hit
for all of them, never a half-loaded request. A load writes exactly the blocks vLLM allocated (the null block
of a sliding group behind the window, and blocks the engine already holds, are left alone); a save takes a
chunk only while every group still holds all of its blocks (`GroupGeometry.skipped_tokens` follows vLLM's own
rule for what it frees), and since a sliding group's blocks are freed at the next schedule, such engines save
in the step (`EngineGeometry.frees_blocks`).

Pipeline parallelism: a stage holds a range of layers (vLLM's own split, `get_pp_indices`); its namespace
names the range and the scheduler, which sees stage 0's config, looks a prefix up under every stage's.
fp8 caches (`kv_quant_mode` FP8_PER_TENSOR, scales from the checkpoint) are stored as the bytes the engine
holds, the quantisation named in the namespace; scales an engine computes itself (`calculate_kv_scales`)
differ per engine and are refused. Hybrid models' recurrent-state groups (`MambaSpec` in vLLM's align mode)
add one state per layer to a chunk: ``hybrid``. Anything else raises `families.Unsupported` naming the family
and reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..common.canonical import CanonicalLayout
from ..common.families import Unsupported, attention_kind
from ..common.layout import PagedGeometry, dtype_name
from .hybrid import STATE_KIND, state_bytes, state_group_format, state_saved_at, state_target

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

NULL_BLOCK = 0   # vLLM's null block: a table entry for a block not allocated (behind a sliding window)
KEEP = -1        # a block the engine already holds: a load leaves it alone

_LAYER_INDEX = re.compile(r"\.(\d+)\.")


@dataclass(frozen=True)
class GroupGeometry:
    """One KV cache group: its layers, its blocks, and how much of the prefix it keeps."""

    layer_names: tuple[str, ...]
    block_size: int
    page_bytes: int                 # one layer's block
    kind: str                       # families.attention_kind: full, swa<W>, local<C>; or hybrid.STATE_KIND
    window: int = 0                 # sliding window (tokens), or attention chunk for local attention
    retained: int = 0               # vLLM's extra_retained_tokens of a sliding window

    @property
    def holds_state(self) -> bool:
        """A recurrent-state group (``hybrid``): one block per chunk, the state at the chunk's last token."""
        return self.kind == STATE_KIND

    @property
    def frees_blocks(self) -> bool:
        """Whether vLLM frees (or, for a state group, overwrites) this group's blocks while a request runs."""
        return self.window > 0 or self.holds_state

    def skipped_tokens(self, computed: int) -> int:
        """vLLM's `get_num_skipped_tokens`: the leading tokens whose blocks it frees once `computed` are done."""
        if self.kind.startswith("swa"):
            return max(0, computed - self.window + 1 - self.retained)
        if self.kind.startswith("local"):
            return computed // self.window * self.window
        return 0


@dataclass(frozen=True)
class EngineGeometry:
    """The chunk format of one engine (or pipeline stage): its bytes, its groups, and its namespace fields."""

    paged: PagedGeometry
    groups: tuple[GroupGeometry, ...]
    family: str                     # the model type (log lines and the connector report)
    mla: bool = False               # one latent-plus-rope plane per layer, the same on every TP rank
    stage: str | None = None        # "first-end/total" under pipeline parallelism
    stages: tuple[PagedGeometry, ...] = ()   # every stage's chunk format (the scheduler looks up all)
    stage_labels: tuple[str, ...] = ()
    canonical: CanonicalLayout | None = None   # every head of the canonical format, for one full-attention group
    kv_heads: int = 0               # this rank's KV heads

    @property
    def frees_blocks(self) -> bool:
        return any(g.frees_blocks for g in self.groups)

    @property
    def hybrid(self) -> bool:
        """Whether a chunk holds recurrent state (``hybrid``) besides attention KV."""
        return any(g.holds_state for g in self.groups)

    def describe(self) -> str:
        """One line for the connector report: family, groups and their kinds, stage, cache format."""
        kinds = ",".join(dict.fromkeys(g.kind for g in self.groups))
        stage = f", stage layers {self.stage}" if self.stage else ""
        what = "mla" if self.mla else "hybrid" if self.hybrid else "dense"
        if self.canonical is not None:
            return f"{what}, {len(self.groups)} group(s) {kinds}; {self.canonical.describe()}"
        return f"{what}, {len(self.groups)} group(s) {kinds}{stage}; {self.paged.cache_format}"

    def valid_chunks(self, block_ids: Sequence[Sequence[int]], first: int, end: int, computed_before: int,
                     computed: int | None = None) -> int:
        """The first chunk of `first .. end` from which on every group still holds every block (a save takes
        those); `computed_before`: the tokens computed before the step whose schedule may have freed some;
        `computed`: after it (a state group holds only the state there: ``hybrid.state_saved_at``)."""
        t = self.paged.chunk_tokens
        for group, ids in zip(self.groups, block_ids):
            if group.holds_state:
                at = state_saved_at(end * t if computed is None else computed, t, ids)
                if at != end - 1:
                    return end
                first = max(first, at)
        for chunk in range(end - 1, first - 1, -1):
            for group, ids in zip(self.groups, block_ids):
                per = t // group.block_size
                mine = ids[chunk * per:(chunk + 1) * per]
                freed = group.skipped_tokens(computed_before) // group.block_size
                if len(mine) < per or (group.frees_blocks and (NULL_BLOCK in mine or chunk * per < freed)):
                    return chunk + 1
        return first

    def chunk_blocks(self, block_ids: Sequence[Sequence[int]], chunk: int, skip_tokens: int = 0,
                     ratio: int | Sequence[int] = 1, state_chunk: int | None = None) -> list[list[int]]:
        """Per group, the kernel block ids of one chunk's blocks; `KEEP` (a load writes none) for those before
        `skip_tokens`, which the engine holds, and for a sliding group's null blocks behind its window.
        `ratio`: kernel blocks per vLLM block (per group, or one for all). A state group's block: for a save
        (`state_chunk` None) the chunk's own; for a load, only chunk `state_chunk` (the last loaded) writes
        its state, into ``hybrid.state_target`` (`KEEP` when there is none: the caller refuses such a load)."""
        t, out = self.paged.chunk_tokens, []
        ratios = [ratio] * len(self.groups) if isinstance(ratio, int) else list(ratio)
        for group, ids, ratio in zip(self.groups, block_ids, ratios):
            if group.holds_state and state_chunk is not None:
                target = state_target(ids, chunk) if chunk == state_chunk else None
                out.append([KEEP if target is None else target])
                continue
            per = t // group.block_size
            held = max(0, skip_tokens - chunk * t) // group.block_size
            mine = [KEEP if i < held or (group.frees_blocks and b == NULL_BLOCK) else b
                    for i, b in enumerate(ids[chunk * per:(chunk + 1) * per])]
            out.append([b if b == KEEP else b * ratio + j for b in mine for j in range(ratio)])
        return out


def layer_index(name: str) -> int:
    m = _LAYER_INDEX.search(name)
    return int(m.group(1)) if m else -1


def engine_geometry(kv_cache_config: "KVCacheConfig", chunk_tokens: int, vllm_config: "VllmConfig") -> EngineGeometry:
    """This engine's chunk format; raises `Unsupported` naming the family and why the connector is off."""
    family = model_family(vllm_config)
    groups = [g for g in getattr(kv_cache_config, "kv_cache_groups", None) or []
              if getattr(g, "enable_kv_transfer", True)]
    if not groups:
        raise Unsupported(family, "the engine has no KV cache groups to transfer")
    if any(getattr(g, "is_eagle_group", False) for g in groups):
        raise Unsupported(family, "speculative-decoding draft KV cache groups are not stored")
    described = [_describe(g.layer_names, g.kv_cache_spec, family, vllm_config, chunk_tokens) for g in groups]
    mla = any(m for _, _, m in described)
    if mla and not all(m for _, _, m in described):
        raise Unsupported(family, "MLA and other attention groups in one model have no chunk layout")
    for group, _, _ in described:
        if chunk_tokens % group.block_size:
            raise Unsupported(family, f"chunk_tokens {chunk_tokens} is not a multiple of a KV cache group's block "
                                      f"size {group.block_size}")
    geoms = tuple(g for g, _, _ in described)
    layout = getattr(kv_cache_config, "kv_cache_layout", None) or "default"
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None) or "unknown"
    cache_format = ("mla;" if mla else "") + "|".join(f for _, f, _ in described) + f";layout={layout};device={device}"
    whole = paged_geometry(sum(len(g.layer_names) for g in geoms),
                           sum(len(g.layer_names) * g.page_bytes * (chunk_tokens // g.block_size) for g in geoms),
                           chunk_tokens, cache_format)
    stages, labels, stage = _stages(geoms, vllm_config, family, chunk_tokens, cache_format)
    canonical, heads = canonical_layout(groups, geoms, mla, stages, chunk_tokens, vllm_config, device)
    return EngineGeometry(whole, geoms, family, mla, stage, stages, labels, canonical, heads)


CPU_KERNELS = ("vec", "vec16")   # vLLM CPU attention kernels whose blocks ``layout.BlockCodec`` reads ("cpu")


def cpu_kernels(dtype: Any, block_size: int, head_size: int) -> str:
    """The kernel set vLLM's CPU attention picks for such a cache (``cpu_attn._get_attn_isa``; its blocks' layout
    depends on it), or "unknown" where it cannot be asked (a vLLM without its CPU backend: unit harnesses, whose
    caches the worker reads "split"; a worker with the CPU backend asks again and refuses another kernel set)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except ImportError:
        return "unknown"
    try:
        return str(_get_attn_isa(dtype, block_size, head_size))
    except Exception:  # noqa: BLE001 - a vLLM whose selector takes other arguments: no canonical format
        return "unknown"


def canonical_layout(groups: Sequence[Any], geoms: Sequence[GroupGeometry], mla: bool, stages: Sequence[Any],
                     chunk_tokens: int, vllm_config: "VllmConfig", device: str
                     ) -> tuple[CanonicalLayout | None, int]:
    """The canonical format of an engine whose cache it describes (one full-attention group of unquantized K
    and V of one head size, one pipeline stage, on CUDA or on the CPU kernels ``BlockCodec`` reads), with this
    rank's KV heads; (None, 0) for any other, whose chunks stay the engine's own block bytes."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    if len(groups) != 1 or mla or stages or geoms[0].kind != "full" or device not in ("cpu", "cuda"):
        return None, 0
    spec = groups[0].kv_cache_spec
    if type(spec) is not FullAttentionSpec or getattr(spec, "head_size_v", spec.head_size) != spec.head_size:
        return None, 0
    if getattr(getattr(spec, "kv_quant_mode", None), "name", "NONE") != "NONE":
        return None, 0
    if device == "cpu" and cpu_kernels(spec.dtype, spec.block_size, spec.head_size) not in (*CPU_KERNELS, "unknown"):
        return None, 0
    # vLLM's unit harnesses have no model config: the even split
    counted = getattr(getattr(vllm_config, "model_config", None), "get_total_num_kv_heads", None)
    tp = getattr(getattr(vllm_config, "parallel_config", None), "tensor_parallel_size", 1)
    total = int(counted()) if counted is not None else spec.num_kv_heads * tp
    layout = CanonicalLayout(len(geoms[0].layer_names), total, spec.head_size, spec.dtype, chunk_tokens)
    return layout, int(spec.num_kv_heads)


def paged_geometry(layers: int, chunk_bytes: int, chunk_tokens: int, cache_format: str) -> PagedGeometry:
    """A chunk of `chunk_bytes` over `layers` layers (the byte split among groups is in `cache_format`)."""
    if chunk_bytes % layers:
        return PagedGeometry(1, chunk_bytes, 1, chunk_tokens, f"{cache_format};layers={layers}")
    return PagedGeometry(layers, chunk_bytes // layers, 1, chunk_tokens, cache_format)


def model_family(vllm_config: "VllmConfig") -> str:
    hf = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
    return str(getattr(hf, "model_type", None) or "unknown model")


def _describe(layer_names: Sequence[str], spec: Any, family: str, vllm_config: "VllmConfig", chunk_tokens: int
              ) -> tuple[GroupGeometry, str, bool]:
    """(the group, its format for the namespace, whether it is MLA) of one spec; raises `Unsupported`."""
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        CrossAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        UniformTypeKVCacheSpecs,
    )

    if isinstance(spec, UniformTypeKVCacheSpecs):
        specs = list(spec.kv_cache_specs.values())
        if len({(type(s), s.page_size_bytes) for s in specs}) != 1:
            raise Unsupported(family, "layers of one KV cache group hold different page formats")
        spec = specs[0]
    if isinstance(spec, MambaSpec):
        fmt = state_group_format(layer_names, spec, family, chunk_tokens)
        return GroupGeometry(tuple(layer_names), spec.block_size, state_bytes(spec), STATE_KIND), fmt, False
    if isinstance(spec, CrossAttentionSpec):
        raise Unsupported(family, "encoder-decoder cross-attention caches hold the encoder's input, not a prefix")
    for name, what in (("page_size_padded", "padded pages"), ("num_head_slots", "head slots"),
                       ("state_content_bytes", "per-page state")):
        if getattr(spec, name, None) is not None:
            raise Unsupported(family, f"KV cache pages with {what} have no chunk layout")
    if getattr(spec, "tokens_per_state", 1) != 1 or getattr(spec, "non_causal", False):
        raise Unsupported(family, "non-causal or multi-token-state KV caches are not prefixes")
    quant = kv_quant(spec, vllm_config, family)
    window, retained, kind = 0, 0, "full"
    mla = type(spec) is MLAAttentionSpec
    if mla:
        if any(getattr(spec, n, None) for n in ("model_version", "alignment", "topk_buffer_width")):
            raise Unsupported(family, "sparse or padded MLA caches (DeepSeek V3.2 indexers) have no chunk layout")
    elif type(spec) in (FullAttentionSpec,):
        if spec.sliding_window or spec.attention_chunk_size:  # allocated as full: every block stays
            kind = attention_kind(spec.sliding_window, spec.attention_chunk_size) + "@full"
    elif type(spec) is SlidingWindowSpec:
        window, retained = spec.sliding_window, getattr(spec, "extra_retained_tokens", 0) or 0
        kind = attention_kind(sliding_window=window)
    elif type(spec) is ChunkedLocalAttentionSpec:
        window, kind = spec.attention_chunk_size, attention_kind(attention_chunk=spec.attention_chunk_size)
    else:
        raise Unsupported(family, f"{type(spec).__name__} KV caches have no chunk layout")
    group = GroupGeometry(tuple(layer_names), spec.block_size, spec.page_size_bytes, kind, window, retained)
    head_v = 0 if mla else spec.head_size_v
    fmt = (f"{kind}(n={len(layer_names)},kv_heads={spec.num_kv_heads},head={spec.head_size},head_v={head_v},"
           f"{dtype_name(spec.dtype)}{quant},block={spec.block_size})")
    return group, fmt, mla


def kv_quant(spec: Any, vllm_config: "VllmConfig", family: str) -> str:
    """The quantisation the cache's bytes are in, for the namespace: "" for the model dtype."""
    mode = getattr(getattr(spec, "kv_quant_mode", None), "name", "NONE")
    if mode == "NONE":
        return ""
    cache = getattr(vllm_config, "cache_config", None)
    dtype = str(getattr(spec, "cache_dtype_str", None) or getattr(cache, "cache_dtype", "fp8"))
    if mode != "FP8_PER_TENSOR":
        raise Unsupported(family, f"{dtype} KV caches with {mode.lower()} scales have no chunk layout")
    if getattr(cache, "calculate_kv_scales", False):
        raise Unsupported(family, f"{dtype} KV cache scales computed by each engine (calculate_kv_scales) differ "
                                  "between engines; use the checkpoint's scales")
    return f",kv_quant={dtype}/per_tensor/checkpoint"


def _stages(groups: Sequence[GroupGeometry], vllm_config: "VllmConfig", family: str, chunk_tokens: int,
            cache_format: str) -> tuple[tuple[PagedGeometry, ...], tuple[str, ...], str | None]:
    """Every pipeline stage's chunk format and label, and this config's stage (None without PP)."""
    pp = getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1)
    if pp <= 1:
        return (), (), None
    text = getattr(vllm_config.model_config, "hf_text_config", None)
    total = getattr(text, "num_hidden_layers", None)
    if total is None or len({(g.page_bytes, g.block_size) for g in groups}) != 1:
        raise Unsupported(family, "pipeline parallelism needs the model's layer count and one page format")
    from vllm.distributed.utils import get_pp_indices

    ranges = [get_pp_indices(int(total), rank, pp) for rank in range(pp)]
    mine = sorted(layer_index(n) for g in groups for n in g.layer_names)
    labels = tuple(f"{first}-{end}/{total}" for first, end in ranges)
    here = [i for i, (first, end) in enumerate(ranges) if mine == list(range(first, end))]
    if not here:
        raise Unsupported(family, f"pipeline stage layers {mine} are not one stage of vLLM's split {list(labels)}")
    per_layer = groups[0].page_bytes * (chunk_tokens // groups[0].block_size)
    stages = tuple(paged_geometry(end - first, (end - first) * per_layer, chunk_tokens, cache_format)
                   for first, end in ranges)
    return stages, labels, labels[here[0]]
