"""The vLLM connector's worker path on a GPU: how long saves block the step, and load bandwidth.

A sub-check of ``bench/gpu_check.py`` (``vllm_worker``); vLLM itself is not installed there, so this drives the
connector's worker half (``kvstore.connectors.common.transfers.Transfers``, what ``KVStoreConnector`` runs on a
worker) over CUDA caches in vLLM 0.32+'s per-layer layout (logical ``[blocks, kv_heads, block_size, 2 * head]``
over a ``[blocks, block_size, kv_heads, 2 * head]`` buffer), bf16, a real daemon with a GPU tier:

* **save blocking**: the step's part of saving N chunks (recording the ready event and queueing the jobs, what
  ``wait_for_save`` does) against the time until the saves are committed (gather on a side stream, one DMA
  into the page-locked arena slot, commit). Goal: blocking under 5 % of the copy time.
* **load bandwidth** into the paged cache: from the page-locked host arena (leased views scattered straight
  into the blocks) against torch's pinned host-to-device copy of the same bytes, and, once repeated reads have
  lifted the chunks into the GPU tier, from the mapped pool (device to device) against a plain device copy.

On ``--cpu-dry-run`` the same code runs on CPU tensors (with the CPU-backed test GPU tier), to test the script.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable


def _start_daemon(device: str, env: dict[str, str], children: list) -> tuple[str, subprocess.Popen, str]:
    import kvstore

    workdir = tempfile.mkdtemp(prefix="kvs-vllm-gpu-")
    sock = os.path.join(workdir, "kv.sock")
    big = device == "cuda"
    args = ["--socket", sock, "--host-mem", "4GiB" if big else "256MiB", "--gpu-mem", "2GiB" if big else "64MiB",
            "--gpu-device", "0", "--disk-size", "0", "--log-level", "warning"]
    if device == "cpu":
        env = {**env, "KVSTORE_GPU_TIER_DEVICE": "cpu"}
    log = open(os.path.join(workdir, "daemon.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "kvstore", "serve", *args], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    children.append(proc)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode}: {open(log.name).read()[-2000:]}")
        try:
            with kvstore.connect("ipc://" + sock, timeout=1, use_arena=False) as c:
                c.ping()
            return "ipc://" + sock, proc, workdir
        except kvstore.DaemonUnavailable:
            time.sleep(0.1)
    raise RuntimeError("daemon did not answer within 60 s")


def _caches(device: str, layers: int, blocks: int, block: int, heads: int, head: int, fill: bool) -> list:
    import torch

    make = torch.randn if fill else torch.zeros
    # vLLM's per-layer view: logical [blocks, heads, block, 2 * head] over memory in [blocks, block, heads, 2 * head]
    return [make(blocks, block, heads, 2 * head, device=device, dtype=torch.bfloat16).permute(0, 2, 1, 3)
            for _ in range(layers)]


def _synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def check_vllm_worker(r: dict, device: str, env: dict[str, str], children: list,
                      time_ms: Callable[[Callable[[], Any]], float]) -> None:
    import torch

    from kvstore.connectors.common.store import ChunkStore, DaemonLink
    from kvstore.connectors.common.transfers import LoadJob, SaveJob, Transfers
    from kvstore.connectors.common.layout import PagedGeometry
    from kvstore.ops import PagedKV, gather

    layers, heads, head, block, chunk_tokens = (32, 8, 128, 16, 256) if device == "cuda" else (4, 2, 32, 16, 256)
    n_chunks = 24 if device == "cuda" else 6
    per_chunk = chunk_tokens // block
    blocks = n_chunks * per_chunk + 8
    address, proc, workdir = _start_daemon(device, env, children)
    transfers = None
    try:
        src = _caches(device, layers, blocks, block, heads, head, fill=True)
        kv = PagedKV.from_blocks(src, block)
        geometry = PagedGeometry(layers, heads * block * 2 * head * 2, per_chunk, chunk_tokens, "gpu-check;bf16")
        chunk_bytes = geometry.chunk_nbytes
        r.update(layers=layers, chunk_MiB=round(chunk_bytes / 2**20, 1), chunks=n_chunks)
        connect = {"pin_arena": device == "cuda", "gpu": True}

        def store() -> ChunkStore:
            return ChunkStore(DaemonLink.to(address, chunk_tokens, timeout=30, connect=connect), "vllm-gpu-check",
                              geometry)

        order = torch.randperm(blocks - 8).tolist()
        ids = [order[i * per_chunk:(i + 1) * per_chunk] for i in range(n_chunks)]
        tokens = list(range(chunk_tokens * n_chunks))
        transfers = Transfers(kv, store(), store(), max_save_bytes=1 << 40)
        _synchronize(device)
        # -- saves: what the step pays (wait_for_save) against when the saves are done
        started = time.perf_counter()
        ready = None
        if device == "cuda":
            ready = torch.cuda.Event()
            ready.record()
        for c in range(n_chunks):
            transfers.submit_save(SaveJob("req", tokens, "", c, 1, lambda i: [ids[i]], chunk_bytes, ready))
        blocking = time.perf_counter() - started
        while not transfers.idle():
            time.sleep(0.0005)
        done = time.perf_counter() - started
        r["saved_chunks"] = transfers.counters.chunks_saved
        r["save_step_blocking_ms"] = round(blocking * 1e3, 3)
        r["save_done_ms"] = round(done * 1e3, 2)
        r["save_blocking_fraction"] = round(blocking / done, 4)
        r["save_GBps"] = round(n_chunks * chunk_bytes / done / 1e9, 2)
        # -- loads into another cache: from the pinned arena, then (after repeated reads) from the GPU tier
        dst = PagedKV.from_blocks(_caches(device, layers, blocks, block, heads, head, fill=False), block)
        loader = Transfers(dst, store(), store(), max_save_bytes=1)

        def load_all() -> None:
            job = loader.run_load(LoadJob("req", tokens, "", 0, n_chunks, lambda i: [ids[i]]))
            assert job.loaded == n_chunks, f"loaded {job.loaded} of {n_chunks} chunks"

        host_ms = time_ms(load_all)
        r["load_host_GBps"] = round(n_chunks * chunk_bytes / host_ms / 1e6, 2)
        r["loaded_bytes_equal"] = all(torch.equal(gather(dst, ids[c]), gather(kv, ids[c])) for c in range(n_chunks))
        pinned = torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=device == "cuda")
        on_device = torch.empty(chunk_bytes, dtype=torch.uint8, device=device)
        ref_ms = time_ms(lambda: on_device.copy_(pinned, non_blocking=True))
        r["torch_pinned_h2d_GBps"] = round(chunk_bytes / ref_ms / 1e6, 2)
        r["load_host_vs_pinned_h2d_ratio"] = round(r["load_host_GBps"] / r["torch_pinned_h2d_GBps"], 3)
        probe = store()
        tiers = _tiers(probe, tokens)
        for _ in range(6):
            if tiers.get("gpu", 0) == n_chunks:
                break
            load_all()
            time.sleep(0.5)
            tiers = _tiers(probe, tokens)
        r["tiers_seen"] = tiers
        if tiers.get("gpu"):
            gpu_ms = time_ms(load_all)
            r["load_gpu_tier_GBps"] = round(n_chunks * chunk_bytes / gpu_ms / 1e6, 2)
            other = torch.empty_like(on_device)
            d2d_ms = time_ms(lambda: other.copy_(on_device))
            r["torch_d2d_GBps"] = round(chunk_bytes / d2d_ms / 1e6, 2)
            r["load_gpu_tier_vs_d2d_ratio"] = round(r["load_gpu_tier_GBps"] / r["torch_d2d_GBps"], 3)
        r["target_save_blocking_fraction"] = 0.05
        r["ok"] = (r["saved_chunks"] == n_chunks and r["loaded_bytes_equal"]
                   and (device != "cuda" or r["save_blocking_fraction"] < 0.05))
        loader.close()
    finally:
        if transfers is not None:
            transfers.close()
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


def _tiers(store: Any, tokens: list[int]) -> dict[str, int]:
    """Which tier serves each chunk of `tokens` (a lease read through the client that maps the GPU pool)."""
    lease = store.link.client().get(store.keys(tokens))
    try:
        counts: dict[str, int] = {}
        for tier in lease.tiers:
            counts[tier] = counts.get(tier, 0) + 1
        return counts
    finally:
        lease.release()
