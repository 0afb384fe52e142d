"""One chunk format every engine reads: the keys, the bytes and the tensor-parallel slices that vLLM, SGLang and
transformers share (``docs/design/keys.md``, "One format for every engine").

Keys
----
SGLang hands its storage backend only its own page keys, never the token ids: the hex SHA-256 of the previous
page's digest and the page's token ids (little-endian uint32; ids beyond uint32 as a 0xff byte and uint64 words),
the first page seeded by the request's ``extra_key`` and ``cache_salt`` (``storage_namespace_seed``). Any engine
can compute that chain from token ids for a few microseconds a page, so it is the chain every engine keys by,
with one page per chunk (SGLang runs with ``--page-size`` equal to ``chunk_tokens``):

    page_i   = SHA-256(page_{i-1} ‖ tokens_i as uint32le)          (page_{-1}: the request's seed, or none)
    x_i      = xxh3-128(x_{i-1} ‖ extras_i ‖ len(extras_i))        (empty while no chunk had extras)
    key_i    = xxh3-128(root ‖ page_i ‖ x_i)
    root     = xxh3-128("kvstore-canonical-v1" ‖ format ‖ model ‖ salt)

Each ``key_i`` still commits to the whole prefix (through ``page_i``), yet is a function of one page key: SGLang
keys a page it is handed without its predecessors. ``root`` holds what SGLang's chain does not: the chunk format
(``format_name``: dtype, layers, all KV heads, head dim, chunk tokens), the model part (``identity_root``: the
model's identity, ``common/model_identity.py``, which every engine computes alike from the checkpoint's weights
and settings; the weights' version or epoch; the LoRA adapter's content) and the connector's configured salt.
``x_i`` holds what SGLang cannot express (multimodal hashes, prompt embeddings): vLLM's keys of such requests
never meet SGLang's (a miss, never a wrong hit). No engine name goes in anywhere.

Bytes
-----
A chunk of all heads is ``[layers, planes, chunk_tokens, kv_heads, head_dim]`` in the KV dtype (planes 2, K
then V; MLA's latent-plus-rope is one plane of one head), the layout of ``layout.KVGeometry``.

Tensor parallelism
------------------
A rank holds a range of KV heads. It stores its slice ``[layers, planes, tokens, its heads, head_dim]`` as an
object of its own, keyed ``slice_key(key_i, first, end, total)`` (the chunk key itself for the full range), so
ranks write in parallel and nobody reassembles. A reader tries its own range first, then the full range (a
TP=1 writer, transformers), then the slices another TP size would have written over its range
(``covering_slices``), and copies out the heads it needs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import xxhash

from .layout import KVGeometry, chunk_from_buffer, dtype_name, session_namespace
from .store import ChunkStore

CANONICAL_VERSION = 1
# The key scheme clients of canonical chunks say at hello: the daemon refuses a client of another scheme (or chunk
# size) in a namespace while chunks of the first are held (``kvstore/server/requests/compat.py``): keys that never meet.
KEY_SCHEME = f"kvstore-canonical/sha256-pages/xxh3-128/v{CANONICAL_VERSION}"
SESSION_PREFIX = "kv:"          # the engine-neutral session namespace: kv:MODEL
TP_SIZES = (1, 2, 4, 8)         # the TP sizes whose slices a reader looks for
_UINT32_MAX = (1 << 32) - 1


# -- keys --------------------------------------------------------------------------------------------------


def storage_seed(extra_key: str | None, cache_salt: str | None) -> bytes | None:
    """The digest SGLang seeds a request's page chain with (``storage_namespace_seed``): None without either."""
    if extra_key is None and cache_salt is None:
        return None
    digest = hashlib.sha256(b"sglang-cache-namespace-v1")
    for part in (extra_key, cache_salt):
        if part is None:
            digest.update(b"\x00")
            continue
        encoded = part.encode("utf-8")
        digest.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return digest.digest()


def page_hashes(token_ids: Sequence[int] | Any, page_tokens: int, seed: bytes | None = None) -> list[bytes]:
    """SGLang's page chain (32-byte SHA-256 digests) over every full page of ``token_ids``."""
    if hasattr(token_ids, "detach"):
        token_ids = token_ids.detach().cpu().numpy()
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ids.size and ids.min() < 0:
        raise ValueError("token ids must be non-negative")
    out: list[bytes] = []
    prior = seed
    for start in range(0, (ids.size // page_tokens) * page_tokens, page_tokens):
        page = ids[start:start + page_tokens]
        h = hashlib.sha256()
        if prior is not None:
            h.update(prior)
        if int(page.max(initial=0)) > _UINT32_MAX:
            h.update(b"\xff")
            h.update(page.astype("<u8").tobytes())
        else:
            h.update(page.astype("<u4").tobytes())
        prior = h.digest()
        out.append(prior)
    return out


def chunk_root(model: str, fmt: str, salt: str = "") -> bytes:
    """The root every key of one model, weights epoch, adapter, format and configured salt hangs from."""
    text = f"kvstore-canonical-v{CANONICAL_VERSION}\0{fmt}\0{model}\0{salt}"
    return xxhash.xxh3_128_digest(text.encode())


def chunk_keys(root: bytes, pages: Sequence[bytes], extras: Sequence[bytes] = ()) -> list[bytes]:
    """``key_i = xxh3-128(root ‖ page_i ‖ x_i)`` for each page key (``x_i``: the chain of extras so far)."""
    keys, chained = [], b""
    for i, page in enumerate(pages):
        extra = extras[i] if i < len(extras) else b""
        if extra or chained:
            chained = xxhash.xxh3_128_digest(chained + extra + len(extra).to_bytes(8, "little"))
        keys.append(xxhash.xxh3_128_digest(root + page + chained))
    return keys


def identity_root(identity: str, weights: str = "", lora: str = "") -> str:
    """The model part of ``chunk_root``: its identity, weights epoch and adapter (every engine writes it so)."""
    return f"model={identity};weights={weights}" + (f";lora={lora}" if lora else "")


def split_request_root(root: str) -> tuple[str | None, str]:
    """(the cache salt, the model part) of a request root made by ``request_root``."""
    if not root.startswith("salt"):
        return None, root
    size, rest = root[4:].split(":", 1)
    n = int(size)
    return rest[:n], rest[n + 1:]


def request_root(cache_salt: str | None, model_part: str) -> str:
    """A request's key root as the vLLM connector passes it along: its cache salt (the page chain's seed) and the
    model part (``identity_root``); without a salt, the model part alone."""
    if not cache_salt:
        return model_part
    return f"salt{len(cache_salt)}:{cache_salt};{model_part}"


# -- tensor-parallel slices ----------------------------------------------------------------------------------


def rank_heads(tp_rank: int, tp_size: int, total: int) -> tuple[int, int]:
    """The KV heads ``[first, end)`` a rank holds: an even split, or one replicated head when ranks outnumber
    heads (vLLM's and SGLang's rule)."""
    if tp_size <= total:
        if total % tp_size:
            raise ValueError(f"{total} KV heads do not split over {tp_size} ranks")
        per = total // tp_size
        return tp_rank * per, (tp_rank + 1) * per
    if tp_size % total:
        raise ValueError(f"{tp_size} ranks do not replicate {total} KV heads evenly")
    head = tp_rank // (tp_size // total)
    return head, head + 1


def slice_key(key: bytes, first: int, end: int, total: int) -> bytes:
    """The key of heads ``[first, end)`` of the chunk ``key`` (the key itself for all of them)."""
    if (first, end) == (0, total):
        return key
    return xxhash.xxh3_128_digest(key + b"heads" + first.to_bytes(4, "little") + end.to_bytes(4, "little"))


def covering_slices(first: int, end: int, total: int) -> list[list[tuple[int, int]]]:
    """Ways to read heads ``[first, end)``, best first: its own slice, all heads, then for each other TP size the
    run of its slices that covers the range (each a list of ``(first, end)`` slices)."""
    ways: list[list[tuple[int, int]]] = [[(first, end)]]
    if (first, end) != (0, total):
        ways.append([(0, total)])
    for size in TP_SIZES:
        if size > total or total % size:
            continue
        per = total // size
        run = [(h, h + per) for h in range(first - first % per, end, per)]
        if run not in ways:
            ways.append(run)
    return ways


# -- formats and identity ------------------------------------------------------------------------------------


def format_name(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, chunk_tokens: int,
                planes: int = 2) -> str:
    """What fixes the bytes of a full chunk (every head)."""
    return (f"layers={num_layers};kv_heads={kv_heads};head_dim={head_dim};dtype={dtype_name(dtype)};"
            f"chunk={chunk_tokens}" + (f";planes={planes}" if planes != 2 else ""))


@dataclass(frozen=True)
class CanonicalLayout:
    """One rank's view of the canonical format: the full chunk and this rank's heads of it."""

    num_layers: int
    kv_heads: int                 # every head of the model
    head_dim: int
    dtype: torch.dtype
    chunk_tokens: int
    first: int = 0                # this rank's heads [first, end)
    end: int = 0
    planes: int = 2

    def __post_init__(self) -> None:
        if self.end == 0:
            object.__setattr__(self, "end", self.kv_heads)
        if not 0 <= self.first < self.end <= self.kv_heads:
            raise ValueError(f"heads [{self.first}, {self.end}) outside {self.kv_heads}")

    @property
    def fmt(self) -> str:
        return format_name(self.num_layers, self.kv_heads, self.head_dim, self.dtype, self.chunk_tokens,
                           self.planes)

    @property
    def geometry(self) -> KVGeometry:
        """This rank's slice: what it reads and writes."""
        return KVGeometry(self.num_layers, self.end - self.first, self.head_dim, self.dtype, self.chunk_tokens,
                          self.planes)

    def describe(self) -> str:
        return f"canonical v{CANONICAL_VERSION} {self.fmt}; heads {self.first}-{self.end}"


def canonical_session(model_id: str, salt: str = "") -> str:
    """The namespace every engine's connector says hello in for canonical chunks: ``kv:MODEL`` (with the salt)."""
    return session_namespace(SESSION_PREFIX + model_id, salt)


def connect(address: str | None, model_id: str, chunk_tokens: int = 256, salt: str = "", **options: Any) -> Any:
    """A client for canonical chunks of ``model_id`` (what the transformers connector's ``checkpoint=`` calls
    take): hello in ``canonical_session``, with the canonical key scheme."""
    import kvstore

    return kvstore.connect(address, namespace=canonical_session(model_id, salt), chunk_tokens=chunk_tokens,
                           key_scheme=KEY_SCHEME, **options)


def config_kv_heads(checkpoint: str) -> int | None:
    """The model's KV head count from its checkpoint's ``config.json`` (None where it says none)."""
    try:
        with open(Path(checkpoint) / "config.json") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config)
    heads = config.get("num_key_value_heads") or config.get("num_attention_heads")
    return int(heads) if heads else None


class CanonicalStore(ChunkStore):
    """One rank's slice of canonical chunks of one model (``model``: ``identity_root``), through a link whose
    session namespace is ``canonical_session``.

    ``keys`` takes a request root made by ``request_root`` (its cache salt seeds the page chain); ``page_keys``
    takes page keys an engine computed itself (SGLang's)."""

    def __init__(self, link: Any, layout: CanonicalLayout, model: str, salt: str = "") -> None:
        super().__init__(link, f"kvstore-canonical-v{CANONICAL_VERSION};{layout.fmt}", layout.geometry)
        self.layout = layout
        self.model = model
        self._salt = salt
        self._roots: dict[str, bytes] = {}

    def _root(self, model: str) -> bytes:
        root = self._roots.get(model)
        if root is None:
            if len(self._roots) >= 256:   # model parts of epochs and adapters gone by
                self._roots.clear()
            root = self._roots[model] = chunk_root(model, self.layout.fmt, self._salt)
        return root

    def keys(self, token_ids: Sequence[int] | torch.Tensor, salt: str = "", extras: Sequence[bytes] = ()
             ) -> list[bytes]:
        cache_salt, model = split_request_root(salt) if salt else (None, self.model)
        pages = page_hashes(token_ids, self.layout.chunk_tokens, storage_seed(None, cache_salt))
        return self.page_keys(pages, model or self.model, extras)

    def whole_keys(self, pages: Sequence[bytes], model: str | None = None, extras: Sequence[bytes] = ()
                   ) -> list[bytes]:
        """The keys of these pages' whole chunks (all heads), which ``ways`` slices."""
        return chunk_keys(self._root(model or self.model), pages, extras)

    def chunk_keys_of(self, token_ids: Sequence[int] | torch.Tensor, salt: str = "", extras: Sequence[bytes] = ()
                      ) -> list[bytes]:
        """As ``keys``, the keys of whole chunks (all heads), which ``ways`` slices."""
        cache_salt, model = split_request_root(salt) if salt else (None, self.model)
        pages = page_hashes(token_ids, self.layout.chunk_tokens, storage_seed(None, cache_salt))
        return chunk_keys(self._root(model or self.model), pages, extras)

    def page_keys(self, pages: Sequence[bytes], model: str | None = None, extras: Sequence[bytes] = (),
                  heads: tuple[int, int] | None = None) -> list[bytes]:
        """The keys of these pages' chunks, of this rank's heads (or ``heads``)."""
        first, end = heads or (self.layout.first, self.layout.end)
        keys = chunk_keys(self._root(model or self.model), pages, extras)
        return [slice_key(k, first, end, self.layout.kv_heads) for k in keys]

    # -- tensor-parallel reads: this rank's heads from whichever slices hold them ----------------------------

    def ways(self, chunk_keys_: Sequence[bytes]) -> list[list[tuple[tuple[int, int], list[bytes]]]]:
        """Every way to read this rank's heads of the chunks ``chunk_keys_`` (whole-chunk keys,
        ``chunk_keys_of``), best first (``covering_slices``): per way, each slice's head range and keys."""
        total = self.layout.kv_heads
        return [[(rng, [slice_key(k, rng[0], rng[1], total) for k in chunk_keys_]) for rng in way]
                for way in covering_slices(self.layout.first, self.layout.end, total)]

    def lookup_any(self, keys: Sequence[bytes], known: int | None = None) -> int:
        """Leading chunks of ``keys`` (whole-chunk keys) whose heads some way holds whole (its own slice first;
        ``known``: what its own slice holds, looked up already)."""
        best = 0 if known is None else known
        ways = self.ways(keys)
        for way in ways if known is None else ways[1:]:
            found = min(self.lookup(slice_keys) for _, slice_keys in way)
            best = max(best, found)
            if best == len(keys):
                break
        return best

    @contextlib.contextmanager
    def lease_heads(self, keys: Sequence[bytes]) -> Iterator[list[Any]]:
        """This rank's slice of the leading chunks of ``keys`` (whole-chunk keys) that one way holds whole, valid
        inside the ``with``: the leased views of its own slice, or copies of its heads out of other slices."""
        best: list[tuple[tuple[int, int], list[bytes]]] | None = None
        found = 0
        for way in self.ways(keys):
            n = min(self.lookup(slice_keys) for _, slice_keys in way)
            if n > found:
                best, found = way, n
            if found == len(keys):
                break
        if best is None or best[0][0] == (self.layout.first, self.layout.end):
            own = self.ways(keys)[0][0][1]
            with self.lease(own) as views:
                yield views
            return
        with contextlib.ExitStack() as stack:
            parts = [(rng, stack.enter_context(self._lease_slice(rng, slice_keys[:found])))
                     for rng, slice_keys in best]
            n = min(len(views) for _, views in parts)
            yield [self._gather_heads(parts, i) for i in range(n)]

    @contextlib.contextmanager
    def _lease_slice(self, rng: tuple[int, int], keys: list[bytes]) -> Iterator[list[Any]]:
        """Views of the leading chunks of heads ``rng`` held at their size."""
        geometry = self._slice_geometry(rng)
        held = self._attempt("get", None, lambda: self._client().get(keys)) if keys else None
        try:
            views = list(held.views) if held is not None else []
            for i, view in enumerate(views):
                if memoryview(view).nbytes != geometry.chunk_nbytes:
                    views = views[:i]
                    break
            yield views
        finally:
            if held is not None:
                held.release()

    def chunk_of(self, view: Any) -> torch.Tensor:
        """A chunk-layout tensor of this rank's slice from what ``lease_heads`` yields (a view or a copy)."""
        if isinstance(view, torch.Tensor):
            return view.view(self.dense.dtype).view(self.dense.chunk_shape)
        return chunk_from_buffer(view, self.dense)

    def _slice_geometry(self, rng: tuple[int, int]) -> KVGeometry:
        g = self.layout
        return KVGeometry(g.num_layers, rng[1] - rng[0], g.head_dim, g.dtype, g.chunk_tokens, g.planes)

    def _gather_heads(self, parts: list[tuple[tuple[int, int], list[Any]]], i: int) -> torch.Tensor:
        """Chunk ``i`` of this rank's heads, copied out of the slices that hold them (as bytes)."""
        out = self.dense.empty_chunks(1)[0]
        first, end = self.layout.first, self.layout.end
        for (a, b), views in parts:
            lo, hi = max(a, first), min(b, end)
            if lo >= hi:
                continue
            chunk = chunk_from_buffer(views[i], self._slice_geometry((a, b)))
            out[:, :, :, lo - first:hi - first].copy_(chunk[:, :, :, lo - a:hi - a])
        return out.reshape(-1).view(torch.uint8)
