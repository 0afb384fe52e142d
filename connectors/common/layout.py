"""Chunk byte layout and namespaces shared by every engine connector.

The chunk layout
----------------
A chunk is `chunk_tokens` consecutive tokens of one sequence, all layers, held
as one contiguous tensor of shape

    [layers, planes, chunk_tokens, kv_heads, head_dim]

(`planes` 2 for K and V, 1 for a single per-token plane such as MLA's
latent-plus-rope vector; see `kvstore.connectors.common.families`) in the dtype the
engine holds it in (fp8 caches as their raw bytes), and stored as the raw bytes of that tensor. Keeping tokens
before heads makes any run of tokens within a layer one contiguous slab, which
is what paged engines address (a block is a run of tokens). The transformers
and SGLang connectors speak this one layout, so the bytes of a prefix do not
depend on which of them computed it; `LAYOUT_VERSION` changes whenever it
does. (vLLM's chunks are its own block bytes: see "paged" below.)

Engine layouts
--------------
Engines hold KV in three shapes. Each converter below moves a batch of chunks
with a fixed number of tensor operations per layer (never a Python loop over
tokens), on whatever device the engine's tensors live:

* dense per layer, `[batch, kv_heads, seq, head_dim]` for K and for V
  (transformers `DynamicCache`): `dense_to_chunks` / `chunks_to_dense`;
* paged (vLLM): whole blocks copied as the engine stores them, by
  `kvstore.ops.gather` / `scatter` over block planes, so these chunks are the
  engine's own block bytes (`PagedGeometry`, `paged_namespace`: the cache
  format is part of the namespace) rather than the layout above;
* host pages (SGLang HiCache), one page per chunk in one of its named layouts:
  `page_to_chunk` / `chunk_into_page`.

Namespaces
----------
A chunk key commits to a namespace string naming everything that makes the
bytes differ: model identity, dtype, layer count, kv heads, head dim, chunk
size, tensor-parallel rank and size, layout version and an optional salt
(`namespace`), and, where they apply, the planes, the attention groups, the
pipeline stage's layer range and the KV quantisation (`families.ChunkLayout`
adds those). Two models that differ in any of these can never read each
other's chunks.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import torch
import xxhash

from kvstore.protocol.hello import MAX_NAMESPACE_CHARS

LAYOUT_VERSION = 1


@dataclass(frozen=True)
class KVGeometry:
    """What fixes the size and shape of a chunk."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    chunk_tokens: int
    planes: int = 2  # 2: K and V of head_dim each; 1: one vector of head_dim per token (MLA, or K|V concatenated)

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "chunk_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.planes not in (1, 2):
            raise ValueError(f"planes must be 1 or 2, got {self.planes}")

    @property
    def chunk_shape(self) -> tuple[int, int, int, int, int]:
        return (self.num_layers, self.planes, self.chunk_tokens, self.num_kv_heads, self.head_dim)

    @property
    def chunk_nbytes(self) -> int:
        n = 1
        for d in self.chunk_shape:
            n *= d
        return n * dtype_size(self.dtype)

    def empty_chunks(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """An uninitialised `[n, *chunk_shape]` tensor."""
        return torch.empty((n, *self.chunk_shape), dtype=self.dtype, device=device)


@dataclass(frozen=True)
class StatePart:
    """One fixed-size tensor of a recurrent layer's state (a conv window or an SSM / delta-rule state), as a
    hybrid chunk holds it: the raw bytes of a contiguous ``shape`` tensor of ``dtype`` (batch axis dropped)."""

    layer: int                  # the model layer it belongs to
    kind: str                   # "conv" (the conv window) or "ssm" (the recurrent state)
    index: int                  # which of the layer's states (transformers' state_idx)
    shape: tuple[int, ...]
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if self.kind not in ("conv", "ssm"):
            raise ValueError(f"a state part is conv or ssm, got {self.kind!r}")

    @property
    def nbytes(self) -> int:
        n = dtype_size(self.dtype)
        for d in self.shape:
            n *= d
        return n

    @property
    def label(self) -> str:
        return f"{self.layer}.{self.kind}{self.index}={'x'.join(map(str, self.shape))}/{dtype_name(self.dtype)}"


@dataclass(frozen=True)
class HybridGeometry:
    """A hybrid model's chunk (transformers only): the attention layers' KV of the chunk's tokens in the chunk
    layout (``kv``, whose layers are the attention layers only, ``attention_layers`` in model order), then each
    recurrent layer's state after the chunk's last token, ``states`` in order, each part's raw bytes.

    Every chunk carries its state, so a prefix may end on any chunk; a load takes every chunk's KV and the last
    chunk's state only. ``label`` names the whole format (which layers hold what, every state's shape and
    dtype) for the namespace.
    """

    kv: KVGeometry
    attention_layers: tuple[int, ...]
    states: tuple[StatePart, ...]

    def __post_init__(self) -> None:
        if len(self.attention_layers) != self.kv.num_layers:
            raise ValueError(f"{len(self.attention_layers)} attention layers, the KV geometry has "
                             f"{self.kv.num_layers}")
        if not self.states:
            raise ValueError("a hybrid chunk holds at least one recurrent state")

    @property
    def chunk_tokens(self) -> int:
        return self.kv.chunk_tokens

    @property
    def state_nbytes(self) -> int:
        return sum(p.nbytes for p in self.states)

    @property
    def chunk_nbytes(self) -> int:
        return self.kv.chunk_nbytes + self.state_nbytes

    @property
    def label(self) -> str:
        """``hf1:<attention layers>:<state parts>:<state bytes>:<digest>``; the digest covers every part's layer,
        name, shape and dtype (a model's list of parts is too long to spell out in a namespace)."""
        full = ";".join(["attn=" + ",".join(map(str, self.attention_layers)), *(p.label for p in self.states)])
        return (f"hf1:{len(self.attention_layers)}attn:{len(self.states)}parts:{self.state_nbytes}B:"
                f"{xxhash.xxh3_64_hexdigest(full.encode())}")


def dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def session_namespace(engine_model: str, salt: str = "") -> str:
    """The namespace a connector says hello with: its model (``kv:MODEL`` for canonical chunks, which every engine
    reads; ``vllm:MODEL`` for an engine's own format) and the configured salt.

    The daemon files every chunk a session stores under its namespace: tenants match it, ``kvstore stats``
    counts by it, and an engine's KV cache events go to the engines of the same namespace. The chunk keys
    themselves commit to the full layout string of `namespace`. A name longer than the wire allows keeps its
    head and ends in a hash of the whole, so two long model names never share a namespace.
    """
    name = engine_model + (f";salt={salt}" if salt else "")
    if len(name) <= MAX_NAMESPACE_CHARS:
        return name
    digest = xxhash.xxh3_128_hexdigest(name.encode())
    return f"{name[:MAX_NAMESPACE_CHARS - len(digest) - 1]}#{digest}"


def namespace(
    model_id: str,
    geometry: KVGeometry,
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    salt: str = "",
    layers: str | None = None,
    tp: str | None = None,
    extra: Sequence[str] = (),
) -> str:
    """The namespace string for chunks of this model, shard and layout.

    `layers` replaces the layer count (a pipeline stage names its range),
    `tp` the rank/size pair (a layout every rank holds alike names no rank),
    and `extra` adds fields of the layout (planes, groups, quantisation). A
    plain dense layout gets exactly the fields it always had.
    """
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} outside tp_size {tp_size}")
    g = geometry
    parts = [
        f"kvstore-chunk-v{LAYOUT_VERSION}",
        f"model={model_id}",
        f"dtype={dtype_name(g.dtype)}",
        f"layers={layers or g.num_layers}",
        f"kv_heads={g.num_kv_heads}",
        f"head_dim={g.head_dim}",
        f"chunk={g.chunk_tokens}",
        f"tp={tp or f'{tp_rank}/{tp_size}'}",
        *([f"planes={g.planes}"] if g.planes != 2 else []),
        *extra,
    ]
    if salt:
        parts.append(f"salt={salt}")
    return ";".join(parts)


# --------------------------------------------------------------------------
# bytes <-> chunk tensors


def chunk_from_buffer(buffer: memoryview | bytes, geometry: KVGeometry) -> torch.Tensor:
    """A CPU tensor of `chunk_shape` viewing `buffer` (no copy).

    The view is only valid while the buffer is; callers copy it out before a
    lease over shared memory ends. Raises ValueError on a size mismatch.
    """
    if memoryview(buffer).nbytes != geometry.chunk_nbytes:
        raise ValueError(
            f"chunk holds {memoryview(buffer).nbytes} bytes, expected {geometry.chunk_nbytes}"
        )
    with warnings.catch_warnings():
        # Read-only shared memory is fine: the tensor is only ever read.
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(buffer, dtype=torch.uint8)
    return raw.view(geometry.dtype).view(geometry.chunk_shape)


def chunks_from_buffers(
    buffers: Sequence[memoryview | bytes],
    geometry: KVGeometry,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Copy `buffers` into one `[n, *chunk_shape]` tensor on `device`."""
    out = geometry.empty_chunks(len(buffers), device)
    for i, buf in enumerate(buffers):
        out[i].copy_(chunk_from_buffer(buf, geometry), non_blocking=False)
    return out


# --------------------------------------------------------------------------
# dense per-layer K/V  ([batch, heads, seq, dim], transformers)


def dense_to_chunks(
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    first_chunk: int,
    num_chunks: int,
    geometry: KVGeometry,
    batch_index: int = 0,
) -> torch.Tensor:
    """Chunks `first_chunk .. first_chunk + num_chunks` of one sequence.

    `keys[l]` and `values[l]` are `[batch, kv_heads, seq, head_dim]`. Returns a
    `[num_chunks, *chunk_shape]` tensor on the same device. A one-plane
    geometry takes its plane as `keys` and no `values`.
    """
    _check_layers(len(keys), len(values) if geometry.planes == 2 else len(keys), geometry)
    t = geometry.chunk_tokens
    start, end = first_chunk * t, (first_chunk + num_chunks) * t
    out = geometry.empty_chunks(num_chunks, keys[0].device)
    for layer in range(geometry.num_layers):
        planes = (keys[layer], values[layer]) if geometry.planes == 2 else (keys[layer],)
        for kv, src in enumerate(planes):
            seq = src[batch_index, :, start:end, :]  # [H, n*T, D]
            if seq.shape[1] != end - start:
                raise ValueError(f"layer {layer} holds {src.shape[2]} tokens, need {end}")
            tokens = seq.unflatten(1, (num_chunks, t)).permute(1, 2, 0, 3)
            out[:, layer, kv].copy_(tokens)
    return out


def chunks_to_dense(chunks: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer `[1, kv_heads, n * chunk_tokens, head_dim]` K and V tensors (V empty for one plane)."""
    n, layers, planes, t, heads, dim = chunks.shape
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    for layer in range(layers):
        for kv, sink in ((0, keys), (1, values))[:planes]:
            tokens = chunks[:, layer, kv]  # [n, T, H, D]
            dense = tokens.permute(2, 0, 1, 3).reshape(heads, n * t, dim)
            sink.append(dense.unsqueeze(0).contiguous())
    return keys, values


# --------------------------------------------------------------------------
# paged caches (vLLM): whole blocks, in the engine's own cache format, through kvstore.ops


@dataclass(frozen=True)
class PagedGeometry:
    """What fixes the bytes of a chunk copied block by block out of a paged cache (``kvstore.ops`` block
    planes): per layer, ``blocks_per_chunk`` blocks of ``layer_block_bytes`` each, as the engine stores them.

    ``cache_format`` names everything that decides those bytes beyond the counts here (attention kind, heads,
    head size, dtype, block size, physical layout, device backend); it goes into the namespace, so engines
    whose blocks differ never read each other's chunks.
    """

    num_layers: int
    layer_block_bytes: int
    blocks_per_chunk: int
    chunk_tokens: int
    cache_format: str

    def __post_init__(self) -> None:
        for name in ("num_layers", "layer_block_bytes", "blocks_per_chunk", "chunk_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def chunk_nbytes(self) -> int:
        return self.num_layers * self.blocks_per_chunk * self.layer_block_bytes


def paged_namespace(model_id: str, geometry: PagedGeometry, *, tp_rank: int = 0, tp_size: int = 1,
                    salt: str = "", replicated: bool = False, stage: str | None = None) -> str:
    """The namespace string for whole-block chunks of this model, shard and cache format.

    `replicated`: every tensor-parallel rank holds the same bytes (MLA), so the namespace names no rank;
    `stage`: the pipeline stage's layer range ("first-end/total")."""
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} outside tp_size {tp_size}")
    g = geometry
    parts = [f"kvstore-pages-v{LAYOUT_VERSION}", f"model={model_id}", f"format={g.cache_format}",
             f"layers={stage or g.num_layers}", f"chunk={g.chunk_tokens}",
             "tp=replicated" if replicated else f"tp={tp_rank}/{tp_size}"]
    if salt:
        parts.append(f"salt={salt}")
    return ";".join(parts)


# --------------------------------------------------------------------------
# host pages (SGLang HiCache)

# For each named host layout: the permutation taking one page as the engine
# holds it (after dropping a leading singleton page axis where it has one) to
# the chunk layout [layers, 2, tokens, heads, dim].
PAGE_LAYOUTS: dict[str, tuple[str, tuple[int, ...]]] = {
    # name: (engine axes, permutation to the chunk layout)
    "layer_first": ("2 L T H D", (1, 0, 2, 3, 4)),
    "page_first": ("2 T L H D", (2, 0, 1, 3, 4)),
    "page_first_direct": ("2 L T H D", (1, 0, 2, 3, 4)),
    "page_head": ("2 H T L D", (3, 0, 2, 1, 4)),
}

# MLA host pools (one latent-plus-rope vector per token, H = 1) have no K/V
# axis: the permutation to [layers, tokens, 1, dim], and the chunk's plane
# axis is inserted after the layers.
MLA_PAGE_LAYOUTS: dict[str, tuple[str, tuple[int, ...]]] = {
    "layer_first": ("L T H D", (0, 1, 2, 3)),
    "page_first": ("T L H D", (1, 0, 2, 3)),
    "page_first_direct": ("L T H D", (0, 1, 2, 3)),
}
_ONE_PAGE_AXIS = ("page_first_direct", "page_head")  # layouts whose page keeps a singleton page axis


def _layouts(planes: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    return PAGE_LAYOUTS if planes == 2 else MLA_PAGE_LAYOUTS


def page_shape(layout: str, geometry: KVGeometry) -> tuple[int, ...]:
    """The shape of one host page as the engine holds it in `layout`."""
    g = geometry
    layouts = _layouts(g.planes)
    sizes = {"2": 2, "L": g.num_layers, "T": g.chunk_tokens, "H": g.num_kv_heads, "D": g.head_dim}
    if layout not in layouts:
        raise ValueError(f"unsupported host page layout {layout!r}")
    shape = tuple(sizes[a] for a in layouts[layout][0].split())
    if layout not in _ONE_PAGE_AXIS:
        return shape
    return (1,) + shape if g.planes == 1 else shape[:1] + (1,) + shape[1:]


def page_to_chunk(page: torch.Tensor, layout: str, planes: int = 2) -> torch.Tensor:
    """A chunk-layout view of one engine host page (no copy)."""
    view = _page_view(page, layout, planes).permute(_layouts(planes)[layout][1])
    return view if planes == 2 else view.unsqueeze(1)


def chunk_into_page(chunk: torch.Tensor, page: torch.Tensor, layout: str, planes: int = 2) -> None:
    """Copy a `[*chunk_shape]` chunk into one engine host page, in place."""
    page_to_chunk(page, layout, planes).copy_(chunk)


def _page_view(page: torch.Tensor, layout: str, planes: int = 2) -> torch.Tensor:
    if layout not in _layouts(planes):
        raise ValueError(f"unsupported host page layout {layout!r}")
    axes = 5 if planes == 2 else 4
    if page.dim() == axes + 1:  # the singleton page axis of the one-page-axis layouts
        page = page.squeeze(1 if planes == 2 else 0)
    if page.dim() != axes:
        raise ValueError(f"host page of shape {tuple(page.shape)} is not {axes}-D")
    return page


def _check_layers(n_k: int, n_v: int, geometry: KVGeometry) -> None:
    if n_k != geometry.num_layers or n_v != geometry.num_layers:
        raise ValueError(
            f"got {n_k} K and {n_v} V layers, geometry has {geometry.num_layers}"
        )
