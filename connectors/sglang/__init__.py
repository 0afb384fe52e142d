"""SGLang connector: a HiCache storage backend (the third tier under SGLang's GPU and host caches).

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvstore",
            "module_path": "kvstore.connectors.sglang", "class_name": "KVStoreHiCacheStorage",
            "interface_v1": 1, "address": "ipc:///run/kvstore/kvstore.sock"}'

SGLang moves KV between its host pool and storage one page (`page_size`
tokens, all layers) at a time, named by its own chained page hashes. Each page
is stored as one kvstore chunk.

Dense pools (one stage, no context parallelism) store the canonical format every
engine reads (`kvstore.connectors.common.canonical`): SGLang's page key is the
canonical page chain, so it is keyed under the model's engine-neutral identity
(the checkpoint's weights fingerprint and settings) and the chunk format, each
rank's page is its slice of the KV heads, and the backend says hello in `kv:MODEL`:
with `--page-size` equal to the other engines' `chunk_tokens` (256 by default),
vLLM and transformers load what SGLang saved and the other way round. Other
pools keep their own format: SGLang's hash re-keyed under a namespace derived
from the model and the host pool's geometry (dtype, layers, kv heads, head dim,
page size, tensor-parallel rank and size), in `sglang:MODEL`.

`batch_exists` returns the leading hit count. `batch_get` / `batch_set` move
flat pages (the generic path); with `"interface_v1": 1` SGLang calls
`batch_get_v1` / `batch_set_v1` instead, which read and write the host pool's
pages in place by their host indices, without a staging page. A daemon that is
down or erroring means misses and dropped writes, never an error in SGLang.

Extra config: `address`, `timeout` (default 2 s), `retry_s` (default 5 s),
`model_id` (default: SGLang's model name), `cache_salt`, `fingerprint`
("sampled", "full" or "off": how the weights are fingerprinted into every key),
`weights_version` (the weights' version at start), `reset_on_flush` (default
true: a `/flush_cache` that follows no change SGLang records of its weights
makes everything saved before it unreachable to this engine; false where the
engine's cache is flushed to make it load from storage, as to share with other
engines). Keys follow the weights SGLang serves, through `update_weights_from_*`,
in both formats: ``identity.py``.

Families (`kvstore.connectors.common.families`):

* MHA host pools (`layer_first`, `page_first`, `page_first_direct`,
  `page_head` layouts) with equal K and V head dims: a page is a dense chunk,
  K and V of every layer; the namespace names the TP rank.
* MLA host pools (DeepSeek, Kimi; `layer_first`, `page_first`,
  `page_first_direct`): a page is one latent-plus-rope vector per token per
  layer, a one-plane chunk. Every TP rank holds the same latent, so the
  namespace names no rank: SGLang lets only the first rank write
  (`is_storage_writer`), and every rank reads that one copy.
* Pipeline stages: each stage's namespace names its stage (`pp=r/n`); under
  attention context parallelism each rank holds its own slice of every page,
  so the namespace names it too (`cp=r/n`), MLA included.

Anything else (hybrid Mamba/SWA pools, split-K or unified page layouts,
packed fp8 MLA rows, decode context parallelism) leaves the backend off with
one logged line naming the pool and the reason, and a connector report that
shows it off in `kvstore stats`: every lookup misses.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import xxhash

import kvstore
from kvstore.errors import ConfigError
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from ..common import canonical
from ..common.fingerprint import MODES
from ..common.families import ChunkLayout, Family, Unsupported, mla_layout
from ..common.layout import (
    MLA_PAGE_LAYOUTS,
    PAGE_LAYOUTS,
    KVGeometry,
    chunk_into_page,
    page_shape,
    page_to_chunk,
    session_namespace,
)
from ..common.report import on_report, refuse
from ..common.identity import engine_identity
from ..common.store import ChunkStore, DaemonLink
from .identity import ModelKeys

log = logging.getLogger("kvstore.connectors.sglang")

__all__ = ["KVStoreHiCacheStorage"]


class KVStoreHiCacheStorage(HiCacheStorage):
    """HiCache pages in a kvstore daemon."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict | None = None) -> None:
        self.config = storage_config
        extra = storage_config.extra_config or {}
        self._address = extra.get("address")
        self._timeout = float(extra.get("timeout", 2.0))
        self._retry_s = float(extra.get("retry_s", 5.0))
        self._model_id = str(extra.get("model_id") or storage_config.model_name or "unknown-model")
        self._salt = str(extra.get("cache_salt", ""))
        self._fingerprint = str(extra.get("fingerprint", "sampled"))
        if self._fingerprint not in MODES:
            raise ConfigError(f"kvstore fingerprint must be one of {', '.join(MODES)}, not {self._fingerprint!r}")
        self._weights_version = str(extra.get("weights_version", ""))
        self._reset_on_flush = _flag(extra.get("reset_on_flush", True), "reset_on_flush")
        dp_rank = int(getattr(storage_config, "dp_rank", 0) or 0)
        # Who this engine is to its router (the daemon publishes its namespace's KV cache events on its topic)
        self._identity = engine_identity(extra.get("engine_id"), extra.get("served_model_name"),
                                         str(storage_config.model_name or self._model_id),
                                         dp_rank, dp_size=2 if dp_rank else 1)   # rank 0 keeps the host name
        self._store: ChunkStore | None = None
        self._layout = ""
        self._planes = 2
        self._root = b""
        self._model: ModelKeys | None = None
        self._canonical: canonical.CanonicalStore | None = None
        self._off_report: kvstore.Client | None = None  # holds the daemon's view of this backend as off

    # -- set-up ------------------------------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        try:
            layout = pool_layout(mem_pool_host, self.config)
        except Unsupported as exc:
            self._off_report = refuse(self._address, "sglang", exc, self._timeout)
            return
        c = self.config
        if layout.family is Family.DENSE and not shard_fields(c):
            self._register_canonical(mem_pool_host, layout)
            return
        ns = layout.namespace(f"sglang:{self._model_id}", tp_rank=c.tp_rank, tp_size=c.tp_size, salt=self._salt,
                              shard=shard_fields(c))
        geometry = layout.geometry
        # One report per engine: its first rank says what it is (every rank serves the same layout).
        report = {"connector": on_report("sglang", layout)} if c.tp_rank == 0 and c.pp_rank == 0 else {}
        link = DaemonLink.to(self._address, geometry.chunk_tokens, self._timeout,
                             connect={**report, "identity": self._identity,
                                      "namespace": session_namespace(f"sglang:{self._model_id}", self._salt)},
                             retry_s=self._retry_s)
        self._model = ModelKeys(mem_pool_host, self._fingerprint, self._weights_version, self._reset_on_flush)
        self._store = ChunkStore(link, ns, geometry)
        self._layout = mem_pool_host.layout
        self._planes = geometry.planes
        self._root = kvstore.keys.namespace_root(ns)

    def _register_canonical(self, pool: Any, layout: ChunkLayout) -> None:
        """Pages in the canonical format: keys from SGLang's page chain under the model part `ModelKeys` keeps in
        step with the weights SGLang serves (the engine-neutral identity of its checkpoint, vLLM's for the same
        checkpoint), this rank's KV heads of every chunk."""
        c, g = self.config, layout.geometry
        self._model = ModelKeys(pool, self._fingerprint, self._weights_version, self._reset_on_flush)
        path = self._model.config_path or str(c.model_name or "")
        total = canonical.config_kv_heads(path) or g.num_kv_heads * c.tp_size
        first, end = canonical.rank_heads(c.tp_rank, c.tp_size, total)
        if end - first != g.num_kv_heads:
            first, end, total = 0, g.num_kv_heads, g.num_kv_heads   # a split this backend does not know
        cl = canonical.CanonicalLayout(g.num_layers, total, g.head_dim, g.dtype, g.chunk_tokens, first, end)
        report = {"connector": on_report("sglang", layout)} if c.tp_rank == 0 else {}
        link = DaemonLink.to(self._address, g.chunk_tokens, self._timeout,
                             connect={**report, "identity": self._identity, "key_scheme": canonical.KEY_SCHEME,
                                      "namespace": canonical.canonical_session(self._model_id, self._salt)},
                             retry_s=self._retry_s)
        self._canonical = canonical.CanonicalStore(link, cl, self._model.part(), self._salt)
        self._store = self._canonical
        self._layout = pool.layout
        self._planes = g.planes
        log.info("kvstore HiCache backend: %s", cl.describe())

    def _keys(self, keys: list[str]) -> list[bytes]:
        """SGLang's page hashes (already chained over the prefix) as chunk keys under the identity of the weights
        SGLang serves now: the canonical keys of those pages, or, for a format of SGLang's own, the hashes re-keyed
        under its namespace."""
        assert self._model is not None   # keys are made only while the store is connected
        if self._canonical is not None:
            return self._canonical.page_keys([bytes.fromhex(k) for k in keys], self._model.part())
        root = self._root + self._model.root()
        return [xxhash.xxh3_128_digest(root + k.encode()) for k in keys]

    def _whole(self, keys: list[str]) -> list[bytes]:
        """The canonical keys of the whole chunks (all heads) of SGLang's pages."""
        assert self._canonical is not None and self._model is not None
        return self._canonical.whole_keys([bytes.fromhex(k) for k in keys], self._model.part())

    def _parent(self, extra_info: HiCacheStorageExtraInfo | None) -> list[bytes]:
        prefix = extra_info.prefix_keys if extra_info is not None else None
        return self._keys(prefix[-1:]) if prefix else []

    # -- lookups -----------------------------------------------------------------------------------------
    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        if self._store is None or not keys:
            return 0
        found = self._store.lookup(self._keys(keys))
        if found < len(keys) and self._canonical is not None:   # heads another TP size (or engine) wrote
            found = self._canonical.lookup_any(self._whole(keys), known=found)
        return found

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- generic path: flat pages ------------------------------------------------------------------------
    def batch_get(
        self, keys: list[str], target_locations: Any | None = None, target_sizes: Any | None = None
    ) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = [None] * len(keys)
        if self._store is None or not keys:
            return out
        chunks = self._store.load(self._keys(keys))
        shape = page_shape(self._layout, self._store.dense)
        for i, chunk in enumerate(chunks):
            target = target_locations[i] if target_locations is not None else None
            if target is None:
                target = torch.empty(shape, dtype=chunk.dtype)
            chunk_into_page(chunk, target.view(shape), self._layout, self._planes)
            out[i] = target
        return out

    def get(self, key: str, target_location: Any | None = None, target_sizes: Any | None = None):
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        if self._store is None or not keys or values is None:
            return False
        shape = page_shape(self._layout, self._store.dense)
        chunks = torch.stack([page_to_chunk(v.view(shape), self._layout, self._planes) for v in values])
        return self._put(self._keys(keys), chunks, []) == len(keys)

    def set(self, key: str, value: Any | None = None, target_location: Any | None = None,
            target_sizes: Any | None = None) -> bool:
        return self.batch_set([key], [value])

    # -- v1: in place, by host index ---------------------------------------------------------------------
    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: HiCacheStorageExtraInfo | None = None
    ) -> list[bool]:
        done = [False] * len(keys)
        if self._store is None or not keys:
            return done
        if self._canonical is not None:
            with self._canonical.lease_heads(self._whole(keys)) as views:
                for i, view in enumerate(views):
                    chunk = self._canonical.chunk_of(view)
                    chunk_into_page(chunk, self._host_page(host_indices, i), self._layout, self._planes)
                    done[i] = True
            return done
        chunks = self._store.load(self._keys(keys))
        for i, chunk in enumerate(chunks):
            chunk_into_page(chunk, self._host_page(host_indices, i), self._layout, self._planes)
            done[i] = True
        return done

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: HiCacheStorageExtraInfo | None = None
    ) -> list[bool]:
        if self._store is None or not keys:
            return [False] * len(keys)
        chunks = torch.stack([page_to_chunk(self._host_page(host_indices, i), self._layout, self._planes)
                              for i in range(len(keys))])
        ok = self._put(self._keys(keys), chunks, self._parent(extra_info)) == len(keys)
        return [ok] * len(keys)

    def _host_page(self, host_indices: torch.Tensor, i: int) -> torch.Tensor:
        assert self._store is not None   # pages move only while the store is connected
        page_size = self._store.geometry.chunk_tokens
        return self.mem_pool_host.get_data_page(int(host_indices[i * page_size]), flat=False)

    def _put(self, keys: list[bytes], chunks: torch.Tensor, parent: list[bytes]) -> int:
        """Store pages; a page already stored counts as written."""
        assert self._store is not None
        chain = parent + keys
        written = self._store.store(chain, chunks, len(parent))
        if written == len(keys):
            return written
        return self._store.lookup(keys)  # put skips pages already stored: count what is there

    def clear(self) -> None:
        """SGLang's ``POST /hicache/storage-backend/clear``: nothing saved before is found by this engine after;
        nothing is deleted (other engines share the pages; the daemon evicts them, ``kvstore invalidate`` drops
        them from every tier)."""
        if self._model is not None:
            self._model.reset()

    def get_stats(self) -> None:
        return None


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise ConfigError(f"kvstore {name} must be true or false, not {value!r}")


def shard_fields(config: HiCacheStorageConfig) -> list[str]:
    """Namespace fields for the part of the cache this rank holds beyond its TP rank.

    A pipeline stage holds its own layers (`pp=r/n`); under attention context parallelism each rank holds
    its own slice of every page (`cp=r/n`), MLA included: only the TP replicas of one slice share chunks.
    """
    fields = [f"pp={config.pp_rank}/{config.pp_size}"] if config.pp_size > 1 else []
    if config.attn_cp_size > 1:
        fields.append(f"cp={config.attn_cp_rank}/{config.attn_cp_size}")
    return fields


def pool_layout(pool: Any, config: HiCacheStorageConfig) -> ChunkLayout:
    """The chunk layout of one page of SGLang's host pool; raises `Unsupported` for other pools."""
    name = type(pool).__name__
    layout = getattr(pool, "layout", None)
    if hasattr(pool, "kv_lora_rank"):  # MLATokenToKVPoolHost
        width = getattr(pool, "kv_cache_dim", pool.kv_lora_rank + pool.qk_rope_head_dim)
        if width != pool.kv_lora_rank + pool.qk_rope_head_dim:
            raise Unsupported("mla", f"{name} rows of {width} values are not latent plus rope (packed fp8 "
                                     "or draft rows)")
        if layout not in MLA_PAGE_LAYOUTS:
            raise Unsupported("mla", f"host layout {layout!r} of {name} is not one of "
                                     f"{', '.join(MLA_PAGE_LAYOUTS)}")
        if getattr(config, "dcp_size", 1) > 1:
            raise Unsupported("mla", "decode context parallelism splits each logical page across ranks; "
                                     "run without --dcp-size to use kvstore")
        return mla_layout(pool.layer_num, pool.kv_lora_rank, pool.qk_rope_head_dim, pool.dtype, pool.page_size,
                          family_label="mla")
    if config.is_mla_model:
        raise Unsupported("mla", f"{name} is not an MLA token pool this backend knows")
    if layout not in PAGE_LAYOUTS:
        raise Unsupported(name, f"host layout {layout!r} is not one of {', '.join(PAGE_LAYOUTS)}")
    head_dim = getattr(pool, "head_dim", None)
    if head_dim is None or getattr(pool, "v_head_dim", head_dim) != head_dim or not hasattr(pool, "head_num"):
        raise Unsupported(name, "K and V of unequal head dims, or no per-head KV (hybrid or state pools)")
    return ChunkLayout(Family.DENSE, KVGeometry(pool.layer_num, pool.head_num, head_dim, pool.dtype, pool.page_size))
