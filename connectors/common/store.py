"""The daemon as every connector sees it: keys, lookup, load, store; any failure is a miss.

The cache is an optimisation. Each method here turns a daemon that is down,
slow, full or answering errors (and a chunk whose size does not match the
geometry) into "nothing cached" or "nothing saved", logs it once per kind, and
lets the engine run its normal prefill.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch

import kvstore
from kvstore.breaker import Breaker
from kvstore.errors import KVStoreError
from kvstore.protocol.engine_blocks import EngineBlocks

from .layout import HybridGeometry, KVGeometry, PagedGeometry, chunk_from_buffer, chunks_to_dense

Geometry = KVGeometry | PagedGeometry | HybridGeometry

log = logging.getLogger("kvstore.connectors")
T = TypeVar("T")


class DaemonLink:
    """A client connected on first use, and again a while after any failure.

    A daemon that is down or hung costs one timeout per `retry_s`, not one per
    request: between a failure and the next attempt `client()` is None (``kvstore/breaker.py``).
    """

    def __init__(self, connect: Callable[[], kvstore.Client], retry_s: float = 5.0) -> None:
        self._connect = connect
        self._client: kvstore.Client | None = None
        self._breaker = Breaker(retry_s)

    @classmethod
    def to(cls, address: str | None, chunk_tokens: int, timeout: float = 2.0,
           connect: dict[str, Any] | None = None, **kw: Any) -> "DaemonLink":
        """A link to the daemon at `address`; `connect`: more `kvstore.connect` options (gpu, pin_arena)."""
        options = dict(connect or {})
        return cls(lambda: kvstore.connect(address, chunk_tokens=chunk_tokens, timeout=timeout, **options), **kw)

    def client(self) -> kvstore.Client | None:
        if self._client is None and self._breaker.allows():
            try:
                self._client = self._connect()
            except Exception as exc:  # noqa: BLE001
                self.failed(exc)
                log.warning("kvstore daemon unavailable, running without the cache: %s", exc)
            else:
                self._breaker.succeeded()
        return self._client

    def failed(self, exc: BaseException) -> None:
        """Drop the client after an error; try again in `retry_s`."""
        if isinstance(exc, (ValueError, kvstore.RequestError)):
            return  # the daemon answered (full, bad request...) or the input was ours: it is up
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001
                pass
        self._client = None
        self._breaker.failed()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class _Fixed:
    """A link over a client the caller owns: never closed or replaced here."""

    def __init__(self, client: kvstore.Client) -> None:
        self._client = client

    def client(self) -> kvstore.Client:
        return self._client

    def failed(self, exc: BaseException) -> None:
        pass


@dataclass(frozen=True)
class VerifyResult:
    """How computed KV compared with the stored chunks of the same keys (see ``ChunkStore.verify``)."""

    checks: int                 # chunks compared (those the daemon still had)
    mismatches: int             # chunks that differed beyond the tolerance
    max_difference: float       # largest absolute difference (inf where either side was not finite)
    first_bad: int | None       # index of the first chunk that differed
    dropped: int = 0            # chunks the daemon dropped because of it


def tolerance_for(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) of a comparison of recomputed KV: the same kernels on the same inputs agree to the last bit
    on CPU, but a prefix computed alone (not as part of a longer prompt) goes through other matrix shapes, so
    the results may differ by rounding: a few ulps of the dtype, far below any damage (a flipped byte changes a
    value by orders of magnitude, or makes it non-finite)."""
    if dtype in (torch.float16, torch.bfloat16):
        return 2e-2, 2e-2
    return 1e-4, 1e-4


def exact_or_tolerance(dtype: torch.dtype, device: torch.device) -> tuple[float, float]:
    """(atol, rtol) for KV an engine recomputed in place of a hit: exact in float32 on the CPU, whose kernels
    are deterministic for the same tokens; ``tolerance_for`` the dtype elsewhere."""
    if device.type == "cpu" and dtype == torch.float32:
        return 0.0, 0.0
    return tolerance_for(dtype)


def compare_chunks(stored: torch.Tensor, computed: torch.Tensor, atol: float, rtol: float
                   ) -> tuple[list[bool], float]:
    """Per chunk, whether ``stored`` differs from ``computed`` beyond ``atol + rtol * |computed|``; and the
    largest absolute difference (inf when a value is not finite)."""
    s, c = stored.float(), computed.float()
    diff = (s - c).abs().nan_to_num(nan=float("inf"))
    bad = (diff > atol + rtol * c.abs()).flatten(1).any(dim=1)
    return bad.tolist(), float(diff.max()) if diff.numel() else 0.0


class ChunkStore:
    """Chunks of one namespace and geometry, through a client or a `DaemonLink`."""

    def __init__(self, link: kvstore.Client | DaemonLink, namespace: str, geometry: Geometry) -> None:
        self.link = link if isinstance(link, DaemonLink) else _Fixed(link)
        self.namespace = namespace
        self.geometry = geometry
        self._warned: set[str] = set()

    @property
    def dense(self) -> KVGeometry:
        """The geometry of dense chunks (what ``load``, ``load_dense`` and ``verify`` read).

        Raises:
            TypeError: the store holds chunks of a paged cache, which have no dense shape.
        """
        if not isinstance(self.geometry, KVGeometry):
            raise TypeError(f"chunks of {self.namespace} are paged ({type(self.geometry).__name__}), not dense")
        return self.geometry

    def keys(self, token_ids: Sequence[int] | torch.Tensor, salt: str = "", extras: Sequence[bytes] = ()
             ) -> list[bytes]:
        """One chained key per full chunk of `token_ids`.

        Args:
            token_ids: the prompt's token ids.
            salt: the request's key root beyond the namespace (its cache salt, and what a connector adds of
                the request's and the model's identity), folded into the chain's root.
            extras: per chunk, what the request holds beyond its token ids there (``kvstore.chunk_keys``).
        """
        ns = self.namespace + (f";request-salt={salt}" if salt else "")
        return kvstore.chunk_keys(ns, token_ids, self.geometry.chunk_tokens, extras=extras)

    def _client(self) -> kvstore.Client:
        client = self.link.client()
        if client is None:
            raise kvstore.DaemonUnavailable("kvstore daemon unavailable (waiting to reconnect)")
        return client

    def lookup(self, keys: Sequence[bytes]) -> int:
        """Leading `keys` stored, 0 when the daemon cannot say. Pins nothing."""
        if not keys:
            return 0
        return self._attempt("lookup", 0, lambda: self._client().lookup(keys))

    def lookup_many(self, chains: Sequence[Sequence[bytes]]) -> list[int]:
        """``lookup`` of several chains in one round trip; all 0 when the daemon cannot say."""
        if not any(chains):
            return [0] * len(chains)
        return self._attempt("lookup", [0] * len(chains), lambda: self._client().lookup_many(chains))

    def lookup_tiers(self, keys: Sequence[bytes]) -> tuple[int, dict[str, int]]:
        """Like `lookup`, with how many of the hits each tier holds."""
        if not keys:
            return 0, {}
        def counted() -> tuple[int, dict[str, int]]:
            found = self._client().lookup_tiers(keys)
            return found.count, dict(found.tiers)

        nothing: tuple[int, dict[str, int]] = (0, {})
        return self._attempt("lookup", nothing, counted)

    def load(self, keys: Sequence[bytes], device: torch.device | str = "cpu") -> torch.Tensor:
        """The longest loadable prefix of `keys` as `[n, *chunk_shape]` on `device`.

        Bytes are copied out of the leased views before the lease ends. A chunk
        of the wrong size ends the prefix there.
        """
        if not keys:
            return self.dense.empty_chunks(0, device)
        return self._attempt("get", self.dense.empty_chunks(0, device), lambda: self._copied_out(keys, device))

    def _copied_out(self, keys: Sequence[bytes], device: torch.device | str) -> torch.Tensor:
        """`load`'s copy out of the leased views (raises what the daemon or a chunk raises)."""
        out = self.dense.empty_chunks(0, device)
        with self._client().get(keys) as views:
            chunks = []
            for view in views:
                try:
                    chunks.append(chunk_from_buffer(view, self.dense))
                except ValueError as exc:
                    self.warn("chunk size", exc)
                    break
            if chunks:
                out = self.dense.empty_chunks(len(chunks), device)
                for i, chunk in enumerate(chunks):
                    # Asynchronous from a page-locked arena mapping; the sync below ends before the lease does.
                    out[i].copy_(chunk, non_blocking=out.is_cuda)
                if out.is_cuda:
                    torch.cuda.current_stream(out.device).synchronize()
        return out

    @contextlib.contextmanager
    def lease(self, keys: Sequence[bytes]) -> Iterator[list[Any]]:
        """Zero-copy views of the longest leasable prefix of `keys` whose sizes fit the geometry, valid
        inside the `with`; an empty list when the daemon cannot give any. The lease ends on exit."""
        started = time.perf_counter()
        held = self._attempt("get", None, lambda: self._client().get(keys)) if keys else None
        try:
            views = list(held.views) if held is not None else []
            for i, view in enumerate(views):
                if _nbytes(view) != self.geometry.chunk_nbytes:
                    self.warn("chunk size", ValueError(
                        f"chunk holds {_nbytes(view)} bytes, expected {self.geometry.chunk_nbytes}"))
                    views = views[:i]
                    break
            yield views
            if held is not None and views:
                self._note_load(list(held.tiers[:len(views)]), views, time.perf_counter() - started)
        finally:
            if held is not None:
                held.release()

    def _note_load(self, tiers: list[str], views: list[Any], seconds: float) -> None:
        """Tell the daemon what this load cost per medium (the time shared by bytes), for routers' tier weights;
        a note that cannot go is dropped, never a failed load."""
        by_medium: dict[str, int] = {}
        for tier, view in zip(tiers, views):
            medium = "GPU" if tier == "gpu" else "CPU"
            by_medium[medium] = by_medium.get(medium, 0) + _nbytes(view)
        total = sum(by_medium.values())
        try:
            for medium, nbytes in by_medium.items():
                self._client().note_load(medium, nbytes, seconds * nbytes / total)
        except KVStoreError:
            pass

    def reserve(self, keys: Sequence[bytes], first: int, count: int,
                engine: Sequence[EngineBlocks | None] | None = None, retention: str = "normal",
                pin_ttl: float | None = None) -> Any:
        """Arena slots for chunks `first .. first + count` of the chain `keys` (a `kvstore.client.Reservation`
        whose views are None for chunks already stored), or None when the daemon cannot give them. `engine`: the
        engine's names of each of those chunks' blocks (for the daemon's KV cache events), if known;
        `retention`, `pin_ttl`: how the daemon keeps them (`Client.put`)."""
        parent = keys[first - 1] if first > 0 else None
        return self._attempt("reserve", None, lambda: self._client().reserve(
            keys[first:first + count], [self.geometry.chunk_nbytes] * count, parent=parent, engine=engine,
            retention=retention, pin_ttl=pin_ttl))

    def commit(self, reservation: Any) -> int:
        return self._attempt("commit", 0, reservation.commit)

    def abort(self, reservation: Any) -> None:
        self._attempt("abort", None, reservation.abort, quiet=True)   # the reservation's TTL frees it anyway

    def load_dense(self, keys: Sequence[bytes], device: torch.device | str = "cpu"
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The longest loadable prefix of `keys` as per-layer `[1, kv_heads, n * chunk_tokens, head_dim]` K and
        V tensors (empty lists on a miss; one-plane chunks give that plane and no V). On the CPU each chunk is
        copied once, straight from the arena into its place in one tensor holding every layer's planes
        (`Client.read`: no round trip where the daemon's index answers, a lease otherwise); elsewhere through
        `load` (one copy to the device, the reordering there)."""
        if torch.device(device).type != "cpu":
            return chunks_to_dense(self.load(keys, device)) if keys else ([], [])
        g = self.dense
        loaded: list[torch.Tensor] = []

        def copy(views: list[Any]) -> None:   # may be called again (a chunk changed under it): starts afresh
            chunks = []
            for view in views:
                try:
                    chunks.append(chunk_from_buffer(view, g))
                except ValueError as exc:
                    self.warn("chunk size", exc)
                    break
            t = g.chunk_tokens
            dense = torch.empty((g.num_layers, g.planes, 1, g.num_kv_heads, len(chunks) * t, g.head_dim),
                                dtype=g.dtype)
            for i, chunk in enumerate(chunks):   # [layers, planes, T, heads, dim] -> [.., heads, T, dim]
                dense[:, :, 0, :, i * t:(i + 1) * t].copy_(chunk.permute(0, 1, 3, 2, 4))
            loaded[:] = [dense] if chunks else []

        def read() -> bool:
            self._client().read(keys, copy)
            return True

        if not self._attempt("get", False, read) or not loaded:
            return [], []
        dense = loaded[0]
        values = [dense[layer, 1] for layer in range(g.num_layers)] if g.planes == 2 else []
        return [dense[layer, 0] for layer in range(g.num_layers)], values

    def verify(self, keys: Sequence[bytes], computed: torch.Tensor, atol: float | None = None,
               rtol: float | None = None) -> VerifyResult:
        """Compare ``computed`` (``[n, *chunk_shape]``, the KV an engine computed for ``keys[:n]``) with the stored
        chunks and report it to the daemon, which drops the chain from the first chunk that differs.

        The stored bytes are read as they are (no checksum check: a chunk whose bytes changed after commit must
        show up here as a mismatch too). Tolerance: ``tolerance_for`` the geometry's dtype unless given. Any
        daemon failure is logged and reported as no checks.
        """
        default_atol, default_rtol = tolerance_for(self.dense.dtype)
        atol = default_atol if atol is None else atol
        rtol = default_rtol if rtol is None else rtol
        keys = list(keys[:len(computed)])
        stored = self.load(keys, device=computed.device)
        return self.report(keys, stored, computed, atol, rtol)

    def report(self, keys: Sequence[bytes], stored: torch.Tensor, computed: torch.Tensor, atol: float,
               rtol: float) -> VerifyResult:
        """Compare ``stored`` (the chunks the daemon gave for ``keys[:len(stored)]``) with ``computed`` and report
        the comparison to the daemon (see ``verify``)."""
        if len(stored) == 0:
            return VerifyResult(0, 0, 0.0, None)
        keys = list(keys[:len(stored)])
        bad, max_diff = compare_chunks(stored, computed[:len(stored)], atol, rtol)
        first_bad = bad.index(True) if any(bad) else None
        result = VerifyResult(len(stored), sum(bad), max_diff, first_bad)
        dropped = self._attempt("verify", None, lambda: self._client().report_verify(
            self.namespace, keys, result.checks, result.mismatches, max_diff, first_bad))
        if dropped is None:
            return result
        if result.mismatches:
            log.error("kvstore chunks of %s differ from the computed KV (%d of %d, max difference %g); the "
                      "daemon dropped %d", self.namespace, result.mismatches, result.checks, max_diff, dropped)
        return VerifyResult(result.checks, result.mismatches, max_diff, first_bad, dropped)

    def store(self, keys: Sequence[bytes], chunks: torch.Tensor, first: int) -> int:
        """Store `chunks` under `keys[first:first + len(chunks)]`; returns chunks written.

        `keys` is the whole chain so that the parent of the first new chunk is
        known to the daemon (it evicts continuations before their prefixes).
        """
        if len(chunks) == 0:
            return 0
        new_keys = list(keys[first:first + len(chunks)])
        parent = keys[first - 1] if first > 0 else None

        def put() -> int:
            written = self._client().put(new_keys, list(chunks), parent=parent)
            assert written is not None   # a put that waits says how many it wrote
            return written

        return self._attempt("put", 0, put)

    def _attempt(self, what: str, fallback: T, call: Callable[[], T], quiet: bool = False) -> T:
        """``call()``, or ``fallback`` when it raises anything: the one place a connector's store call turns an
        unexpected failure (daemon gone, a reply or chunk it cannot use) into its fallback path, a miss or
        nothing saved, so the engine prefills as if no cache were there; logged through `warn` (``quiet``: at
        debug level only, for clean-up whose failure changes nothing)."""
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - any failure falls back to prefill, never to the engine
            if quiet:
                log.debug("kvstore %s failed: %s", what, exc)
            else:
                self.warn(what, exc)
            return fallback

    def warn(self, what: str, exc: BaseException) -> None:
        """Note a failure of `what` (once per kind at warning level) and let the link decide on reconnecting."""
        self.link.failed(exc)
        if what not in self._warned:
            self._warned.add(what)
            log.warning("kvstore %s failed, running without the cache: %s", what, exc)
        else:
            log.debug("kvstore %s failed: %s", what, exc)


def _nbytes(view: Any) -> int:
    if isinstance(view, torch.Tensor):
        return view.numel() * view.element_size()
    return memoryview(view).nbytes
