"""Loads and saves of paged KV taken off the engine's step: two background threads, one copy each way.

A load leases the chunks (zero-copy views of the shared arena, or of the daemon's GPU pool when the engine maps
it) and scatters each view straight into the request's blocks; the lease ends once the copy has. A save
reserves arena slots and gathers the blocks straight into them, then commits. Neither passes through a staging
buffer on CPU; on a GPU a load is one host-to-device (or device-to-device) scatter on a side stream, and a save
one device gather plus one device-to-host DMA into the page-locked slot (``kvstore.mapped.gpu_pool``).

Threads. Loads and saves each have a thread and a daemon client of their own (a client is not thread-safe, and
a save stuck behind a slow daemon must not hold up loads). The engine's step only enqueues and collects:
``submit_load`` / ``submit_save`` return at once, ``collect`` hands back what finished since the last call.

Ordering. A save is enqueued at the end of the step that computed its tokens (on a GPU with the event recorded
then, which the side stream waits for), so the gather never reads KV that is not written yet. The blocks stay
valid while the request runs; the connector keeps a finished request's blocks from being freed until its saves
are done, and a preempted request's saves are dropped or waited for (``settle``) before its blocks are reused.

Bounds and failure. Saves in flight are bounded in bytes: one that does not fit is dropped (a future miss), so
a daemon that is slow or gone never stalls the engine or grows memory. Any failure of a load is reported as the
tokens it did not write, which the engine recomputes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, cast

import torch

from kvstore.ops import PagedKV
from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.mapped.gpu_pool import load_async, save_async

from .canonical import CanonicalStore
from .block_codec import BlockCodec
from .store import ChunkStore, exact_or_tolerance

log = logging.getLogger("kvstore.connectors")


@dataclass
class LoadJob:
    """Chunks ``first_chunk .. num_chunks`` of a request's prefix into its blocks."""

    req_id: str
    token_ids: list[int]
    salt: str                                   # the request's key root (``ChunkStore.keys``)
    first_chunk: int
    num_chunks: int
    chunk_blocks: Callable[[int], list[list[int]]]   # chunk index -> per cache group, the block ids it fills
    loaded: int = 0                             # chunks written (set by the job)
    extras: list[bytes] = field(default_factory=list)   # per chunk, what its key folds in beyond its tokens


@dataclass
class SaveJob:
    """New chunks ``first_chunk .. first_chunk + num_chunks`` of a request, out of its blocks."""

    req_id: str
    token_ids: list[int]
    salt: str
    first_chunk: int
    num_chunks: int
    chunk_blocks: Callable[[int], list[list[int]]]
    nbytes: int
    ready: Any = None          # CUDA event after which the blocks hold the KV (None on CPU)
    saved: int = 0
    verify: bool = False       # compare the computed chunks with the stored ones instead of saving them
    engine: list[EngineBlocks | None] | None = None   # the engine's names of each chunk's blocks, if known
    retention: str = "normal"    # how the daemon keeps the chunks (``kvstore.protocol.retention``)
    pin_ttl: float | None = None
    extras: list[bytes] = field(default_factory=list)   # per chunk, what its key folds in beyond its tokens


@dataclass
class Counters:
    chunks_loaded: int = 0
    load_failures: int = 0
    chunks_saved: int = 0
    saves_dropped: int = 0
    save_failures: int = 0
    chunks_verified: int = 0
    verify_mismatches: int = 0
    load_seconds: float = 0.0  # wall time the loader spent on loads
    save_seconds: float = 0.0  # ... and the saver on saves

    def as_dict(self) -> dict[str, int | float]:
        return dict(self.__dict__)


@dataclass
class _Done:
    loads: list[LoadJob] = field(default_factory=list)
    saves: list[SaveJob] = field(default_factory=list)


class Transfers:
    """The background loader and saver of one engine worker."""

    def __init__(self, kv: PagedKV | Sequence[PagedKV], load_store: ChunkStore, save_store: ChunkStore,
                 max_save_bytes: int, dtype: torch.dtype = torch.uint8, codec: BlockCodec | None = None) -> None:
        # one per KV cache group
        self.kvs: list[PagedKV] = list(kv) if isinstance(kv, (list, tuple)) else [cast(PagedKV, kv)]
        self.kv = self.kvs[0]
        self.codec = codec                          # chunks in the canonical layout (one group), not block bytes
        self.dtype = dtype                          # of the cache's values, for comparisons
        self.counters = Counters()
        self._load_store, self._save_store = load_store, save_store
        self._max_save_bytes = max_save_bytes
        self._lock = threading.Condition()
        self._done = _Done()
        self._save_bytes = 0                        # bytes of saves queued or running
        self._saves_by_req: dict[str, int] = {}     # req id -> saves queued or running
        self._running_save: SaveJob | None = None
        self._loads: queue.Queue[LoadJob | None] = queue.Queue()
        self._saves: list[SaveJob] = []             # FIFO, guarded by _lock (settle removes from it)
        self._closed = False
        self._threads = [threading.Thread(target=self._load_loop, name="kvstore-load", daemon=True),
                         threading.Thread(target=self._save_loop, name="kvstore-save", daemon=True)]
        for t in self._threads:
            t.start()

    # -- the engine's side -----------------------------------------------------------------------------------
    def submit_load(self, job: LoadJob) -> None:
        self._loads.put(job)

    def submit_save(self, job: SaveJob) -> bool:
        """Queue a save; False (dropped: a future miss) when the bytes in flight would pass the bound."""
        with self._lock:
            if self._save_bytes and self._save_bytes + job.nbytes > self._max_save_bytes:
                self.counters.saves_dropped += job.num_chunks
                return False
            self._save_bytes += job.nbytes
            self._saves_by_req[job.req_id] = self._saves_by_req.get(job.req_id, 0) + 1
            self._saves.append(job)
            self._lock.notify_all()
        return True

    def saving(self, req_id: str) -> bool:
        with self._lock:
            return req_id in self._saves_by_req

    def idle(self) -> bool:
        """Nothing queued or running."""
        with self._lock:
            return (not self._saves and self._running_save is None and self._loads.unfinished_tasks == 0)

    def collect(self) -> _Done:
        """The loads and saves finished since the last call."""
        with self._lock:
            done, self._done = self._done, _Done()
        return done

    def settle(self, req_ids: Sequence[str]) -> None:
        """Before these requests' blocks are reused: drop their queued saves, wait for a running one."""
        wanted = set(req_ids)
        with self._lock:
            for job in [j for j in self._saves if j.req_id in wanted]:
                self._saves.remove(job)
                self.counters.saves_dropped += job.num_chunks
                self._finish_save(job)
            while self._running_save is not None and self._running_save.req_id in wanted:
                self._lock.wait(0.05)

    def run_load(self, job: LoadJob) -> LoadJob:
        """Do a load now, on the caller's thread (the engine's synchronous load path)."""
        self._load(job)
        return job

    def run_save(self, job: SaveJob) -> SaveJob:
        self._verify(job) if job.verify else self._save(job)
        return job

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._loads.put(None)
        for t in self._threads:
            t.join(timeout=5)

    # -- the threads -----------------------------------------------------------------------------------------
    def _load_loop(self) -> None:
        while True:
            job = self._loads.get()
            if job is None:
                self._loads.task_done()
                return
            self._load(job)
            with self._lock:
                self._done.loads.append(job)
            self._loads.task_done()

    def _load(self, job: LoadJob) -> None:
        started = time.perf_counter()
        try:
            store = self._load_store
            tokens = job.token_ids[: job.num_chunks * store.geometry.chunk_tokens]
            if isinstance(store, CanonicalStore):   # this rank's heads, whatever TP size wrote them
                whole = store.chunk_keys_of(tokens, job.salt, job.extras)[job.first_chunk: job.num_chunks]
                lease = store.lease_heads(whole)
            else:
                lease = store.lease(store.keys(tokens, job.salt, job.extras)[job.first_chunk: job.num_chunks])
            with lease as views:
                events = []
                for i, view in enumerate(views):
                    events += self._scatter(_as_tensor(view), job.chunk_blocks(job.first_chunk + i))
                for event in events:
                    if event is not None:
                        event.synchronize()  # the lease may end only once the copies have
                written = len(views)
            job.loaded = written  # only once the lease ended as held: a lease taken back is a failed load
        except Exception as exc:  # noqa: BLE001 - a failed load is a recompute, never a failed step
            log.warning("kvstore load of request %s failed: %s", job.req_id, exc)
        with self._lock:
            self.counters.load_seconds += time.perf_counter() - started
            self.counters.chunks_loaded += job.loaded
            if job.first_chunk + job.loaded < job.num_chunks:
                self.counters.load_failures += 1

    def _save_loop(self) -> None:
        while True:
            with self._lock:
                while not self._saves and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                job = self._running_save = self._saves.pop(0)
            self._verify(job) if job.verify else self._save(job)
            with self._lock:
                self._running_save = None
                self._finish_save(job)
                self._lock.notify_all()

    def _finish_save(self, job: SaveJob) -> None:
        """Account for a save that ended (done, failed or dropped); the caller holds the lock."""
        self._save_bytes -= job.nbytes
        left = self._saves_by_req.get(job.req_id, 1) - 1
        if left:
            self._saves_by_req[job.req_id] = left
        else:
            self._saves_by_req.pop(job.req_id, None)
        self._done.saves.append(job)

    def _save(self, job: SaveJob) -> None:
        store = self._save_store
        t = store.geometry.chunk_tokens
        end = job.first_chunk + job.num_chunks
        reservation, failed = None, True
        started = time.perf_counter()
        try:
            keys = store.keys(job.token_ids[: end * t], job.salt, job.extras)
            reservation = store.reserve(keys, job.first_chunk, job.num_chunks, job.engine, job.retention,
                                        job.pin_ttl)
            if reservation is None:
                return
            events = []
            for i, view in enumerate(reservation.views):
                if view is not None:  # None: already stored (by another engine or request)
                    events += self._gather(job.chunk_blocks(job.first_chunk + i), _as_tensor(view), job.ready)
            for event in events:
                if event is not None:
                    event.synchronize()
            job.saved = store.commit(reservation)
            reservation, failed = None, False
        except Exception as exc:  # noqa: BLE001 - a lost save is a future miss
            store.warn("save", exc)
        finally:
            if reservation is not None:
                store.abort(reservation)
            with self._lock:
                self.counters.save_seconds += time.perf_counter() - started
                self.counters.chunks_saved += job.saved
                self.counters.save_failures += int(failed)

    def _verify(self, job: SaveJob) -> None:
        """Compare the chunks the engine computed with the stored ones and report it (the daemon drops a chain
        that differs). A failure is logged; the request has its computed KV either way."""
        store = self._save_store
        t, nbytes = store.geometry.chunk_tokens, store.geometry.chunk_nbytes
        end = job.first_chunk + job.num_chunks
        try:
            keys = store.keys(job.token_ids[: end * t], job.salt, job.extras)[job.first_chunk:end]
            computed = torch.empty((job.num_chunks, nbytes), dtype=torch.uint8, device=self.kv.device)
            events = [e for i in range(job.num_chunks)
                      for e in self._gather(job.chunk_blocks(job.first_chunk + i), computed[i], job.ready)]
            for event in events:
                if event is not None:
                    event.synchronize()
            with store.lease(keys) as views:
                stored = torch.empty((len(views), nbytes), dtype=torch.uint8, device=self.kv.device)
                for i, view in enumerate(views):
                    stored[i].copy_(_as_tensor(view))
            atol, rtol = exact_or_tolerance(self.dtype, self.kv.device)
            result = store.report(keys, stored.view(self.dtype), computed.view(self.dtype), atol, rtol)
        except Exception as exc:  # noqa: BLE001 - a failed verification is a log line, never a failed request
            log.warning("kvstore verification of request %s failed: %s", job.req_id, exc)
            return
        with self._lock:
            self.counters.chunks_verified += result.checks
            self.counters.verify_mismatches += result.mismatches

    # -- one chunk, group by group ---------------------------------------------------------------------------
    def _pieces(self, chunk: torch.Tensor, groups: list[list[int]]) -> list[torch.Tensor]:
        """The chunk's bytes split by cache group: each group's layers x blocks x block bytes, in order."""
        flat, at, out = chunk.reshape(-1).view(torch.uint8), 0, []
        for kv, ids in zip(self.kvs, groups):
            n = len(kv.rows) * len(ids) * kv.row_bytes
            out.append(flat[at:at + n])
            at += n
        if at != flat.numel():
            raise ValueError(f"the chunk holds {flat.numel()} bytes; its blocks hold {at}")
        return out

    def _scatter(self, chunk: torch.Tensor, groups: list[list[int]]) -> list[Any]:
        """Write one chunk into the blocks vLLM allocated: those marked -1 (blocks the engine already holds, the
        null block of a sliding window) are left alone."""
        if self.codec is not None:
            self.codec.load(chunk, groups[0])
            return [_Synced(self.codec.device)]
        events = []
        for kv, piece, ids in zip(self.kvs, self._pieces(chunk, groups), groups):
            keep = [i for i, b in enumerate(ids) if b >= 0]
            if len(keep) < len(ids):
                if not keep:
                    continue
                piece = piece.view(len(kv.rows), len(ids), kv.row_bytes)[:, keep].contiguous()
                ids = [ids[i] for i in keep]
            events.append(load_async(kv, piece, ids))
        return events

    def _gather(self, groups: list[list[int]], slot: torch.Tensor, after: Any) -> list[Any]:
        """Copy one chunk's blocks, every group, into `slot` (every id must be an allocated block)."""
        if self.codec is not None:
            if after is not None:
                after.synchronize()
            self.codec.save(groups[0], slot)
            return [_Synced(self.codec.device)]
        return [save_async(kv, ids, piece, after=after)
                for kv, piece, ids in zip(self.kvs, self._pieces(slot, groups), groups)]


class _Synced:
    """The end of a copy made on the current stream (the codec's): synchronizing waits for that stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


def _as_tensor(view: Any) -> torch.Tensor:
    if isinstance(view, torch.Tensor):
        return view  # a chunk of the daemon's GPU pool, mapped into this process
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a leased view is read-only; it is only read
        return torch.frombuffer(view, dtype=torch.uint8)
