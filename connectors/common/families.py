"""What a chunk holds for each model family, and the namespace that names it.

Every connector describes the KV cache it serves as one `ChunkLayout`; the
layout fixes the chunk's bytes (`geometry`) and its namespace (`namespace`).
Families, and what one chunk of `chunk_tokens` tokens holds for each:

* **dense** (Llama, Qwen, Mistral, Gemma, gpt-oss, ... grouped-query attention
  included): `[layers, 2, T, kv_heads, head_dim]`, K then V of every token of
  every layer the engine (or pipeline stage) holds. The namespace names the
  tensor-parallel rank: each rank holds its own heads.
* **mla** (DeepSeek V2/V3/R1, Kimi K2, GLM-4.5 MoE-lite...): one vector per
  token per layer, the normalised KV latent (`kv_lora_rank`) followed by the
  roped key (`qk_rope_head_dim`): `[layers, 1, T, 1, rank + rope]`. Every
  tensor-parallel rank holds the same latent, so the namespace names no rank
  (`tp=replicated`): one rank's save serves every rank and every TP size.
  The namespace names the split (`mla=<rank>+<rope>`): rows of one width
  split otherwise hold other bytes.

Layered on either family:

* **attention groups** (sliding-window and hybrid models): layers that share a
  block table, each group named by how much of the prefix it keeps (`full`,
  `swa<W>`, `local<C>` for chunked local attention). A chunk still holds every layer's
  every token, in model layer order, so one chunk is the whole prefix step for
  every group: a prefix is reusable for all groups or a miss for all of them.
  A sliding layer only needs the last W tokens of a loaded prefix; its other
  rows are bytes it skips (the price of never half-loading a request, and of
  chunks that do not depend on where in a prompt they sit). The group kinds go
  into the namespace, so a layout with other windows never matches.
* **pipeline stages**: a stage holds layers `[first, end)` of `total`; its
  namespace names that range (`layers=first-end/total`), and a prefix hits
  only when every stage's namespace holds it.
* **quantised KV caches** (fp8): the bytes as the engine holds them (`dtype`
  is the storage dtype, e.g. uint8), with the quantisation and the source of
  its scales in the namespace (`kv_quant=fp8_e4m3/per_tensor/checkpoint`).
  Per-tensor scales that come from the checkpoint are a function of the model
  and revision, which the namespace already names; scales an engine computes
  from its own first batch differ per engine, so such a cache is refused.

Hybrid Mamba-2 / linear-attention models add each recurrent layer's state at
the chunk's last token to the chunk: vLLM's own block format
(``kvstore.connectors.vllm.hybrid``), and transformers' (``kvstore.connectors.hf.hybrid``:
the attention layers' KV then the states, named by `state` in the namespace);
neither is the canonical cross-engine format.
Anything else (recurrent state elsewhere, encoder-decoder cross
attention, per-token-head quantisation with in-page scales) raises
`Unsupported`, whose one line names the family and the reason; connectors log
it once at start and report themselves off (`ConnectorState`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Sequence

import torch

from .layout import KVGeometry, namespace


class Family(str, Enum):
    DENSE = "dense"
    MLA = "mla"


class Unsupported(Exception):
    """A KV cache no chunk layout describes; the connector stays off."""

    def __init__(self, family: str, reason: str) -> None:
        super().__init__(f"{family}: {reason}")
        self.family = family
        self.reason = reason

    def line(self, engine: str) -> str:
        return f"kvstore {engine} connector off ({self.family}): {self.reason}"


def attention_kind(sliding_window: int | None = None, attention_chunk: int | None = None) -> str:
    """The name of how much of the prefix a layer attends to: `full`, `swa<W>` or `local<C>`."""
    if sliding_window:
        return f"swa{sliding_window}"
    if attention_chunk:
        return f"local{attention_chunk}"
    return "full"


@dataclass(frozen=True)
class StageRange:
    """The layers `[first, end)` of `total` that one pipeline stage holds."""

    first: int
    end: int
    total: int

    def __post_init__(self) -> None:
        if not 0 <= self.first < self.end <= self.total:
            raise ValueError(f"stage layers {self.first}-{self.end} outside 0-{self.total}")

    @property
    def label(self) -> str:
        return f"{self.first}-{self.end}/{self.total}"


@dataclass(frozen=True)
class ChunkLayout:
    """What fixes a chunk's bytes and name for one engine (shard, stage)."""

    family: Family
    geometry: KVGeometry
    attention: tuple[str, ...] = ("full",)  # the kind of each attention group, in the engine's group order
    stage: StageRange | None = None
    kv_quant: str = ""  # "" for caches in the model dtype
    # How one MLA row divides: (kv_lora_rank, qk_rope_head_dim). Two splits of one width hold other bytes.
    mla_split: tuple[int, int] | None = None
    # A hybrid model's recurrent states in each chunk (`layout.HybridGeometry.label`; transformers only), "" for none.
    state: str = ""
    family_label: str = field(default="", compare=False)  # the model family, for log lines

    def __post_init__(self) -> None:
        if self.family is Family.MLA and (self.geometry.planes != 1 or self.geometry.num_kv_heads != 1):
            raise ValueError("an MLA chunk holds one plane of one head")
        if (self.family is Family.MLA) != (self.mla_split is not None):
            raise ValueError("an MLA layout, and only one, names its (kv_lora_rank, rope) split")
        if self.mla_split is not None and sum(self.mla_split) != self.geometry.head_dim:
            raise ValueError(f"MLA split {self.mla_split} does not add up to {self.geometry.head_dim}")
        if self.stage is not None and self.stage.end - self.stage.first != self.geometry.num_layers:
            raise ValueError(f"stage {self.stage.label} does not hold {self.geometry.num_layers} layers")
        if not self.attention:
            raise ValueError("a layout has at least one attention group")

    @property
    def replicated(self) -> bool:
        """Whether every tensor-parallel rank holds the same bytes (one copy serves them all)."""
        return self.family is Family.MLA

    @property
    def hybrid(self) -> bool:
        """Whether some layers keep less than the whole prefix, or groups have their own block tables."""
        return self.attention != ("full",)

    def namespace(self, model_id: str, *, tp_rank: int = 0, tp_size: int = 1, salt: str = "",
                  shard: Sequence[str] = ()) -> str:
        """The namespace of this layout's chunks; a plain dense layout keeps its historic name.

        `shard`: fields naming which part of the cache this engine process holds beyond its TP rank, where
        the engine says so by rank rather than by layer range (SGLang's `pp=r/n`, context-parallel `cp=r/n`).
        """
        extra: list[str] = list(shard)
        if self.family is not Family.DENSE:
            extra.append(f"family={self.family.value}")
        if self.mla_split is not None:
            extra.append("mla={}+{}".format(*self.mla_split))
        if self.hybrid:
            extra.append("attention=" + ",".join(self.attention))
        if self.kv_quant:
            extra.append(f"kv_quant={self.kv_quant}")
        if self.state:
            extra.append(f"state={self.state}")
        return namespace(
            model_id, self.geometry, tp_rank=tp_rank, tp_size=tp_size, salt=salt,
            layers=self.stage.label if self.stage else None,
            tp="replicated" if self.replicated else None, extra=extra,
        )

    def for_stage(self, stage: StageRange) -> "ChunkLayout":
        """This layout as another pipeline stage holds it: its own layer range, the same kinds.

        Stages hold the same attention groups (vLLM gives every stage the same
        group specs, only the layers differ), so the kinds carry over.
        """
        geometry = replace(self.geometry, num_layers=stage.end - stage.first)
        return replace(self, geometry=geometry, stage=stage)

    def describe(self) -> str:
        """One line for logs: family, layers, planes, dtype, groups, stage, quantisation."""
        g = self.geometry
        parts = [self.family_label or self.family.value, f"{g.num_layers} layers",
                 f"{g.planes} plane(s) of {g.num_kv_heads}x{g.head_dim}", str(g.dtype).removeprefix("torch.")]
        if self.hybrid:
            parts.append("attention " + ",".join(self.attention))
        if self.stage:
            parts.append(f"stage layers {self.stage.label}")
        if self.kv_quant:
            parts.append(self.kv_quant)
        if self.state:
            parts.append(f"recurrent state {self.state}")
        return ", ".join(parts)


def mla_geometry(num_layers: int, kv_lora_rank: int, rope_dim: int, dtype: torch.dtype,
                 chunk_tokens: int) -> KVGeometry:
    """One plane of one head, `kv_lora_rank + rope_dim` wide."""
    return KVGeometry(num_layers, 1, kv_lora_rank + rope_dim, dtype, chunk_tokens, planes=1)


def mla_layout(num_layers: int, kv_lora_rank: int, rope_dim: int, dtype: torch.dtype, chunk_tokens: int,
               **kw: object) -> ChunkLayout:
    """The layout of an MLA cache: one latent-plus-rope row per token per layer (`kw`: attention, stage...)."""
    geometry = mla_geometry(num_layers, kv_lora_rank, rope_dim, dtype, chunk_tokens)
    return ChunkLayout(Family.MLA, geometry, mla_split=(kv_lora_rank, rope_dim), **kw)  # type: ignore[arg-type]
