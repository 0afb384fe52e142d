"""LMCache as a peer of ``bench/peers.py``: its server from its own virtualenv, driven by a script run there.

Kept apart from ``peers.py`` (the runner and the other peers) because it is its own world: a virtualenv of its
own (``--install-lmcache``), a driver script that runs in it, a server that takes ~45 s to start cold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.peer_payloads import Payloads

LMCACHE_VENV = Path(os.environ.get("LMCACHE_VENV", Path.home() / ".cache/kvstore-bench/lmcache-venv"))


# Runs inside LMCache's virtualenv: one chunk size, as an engine-driven worker on the CPU would (register a
# KV layout, then prepare/commit store into the server's shared-memory slots, lookup + prefetch, prepare/commit
# retrieve). One LMCache key covers the 16 chunks of a batch (its chunk size is 256 tokens); a chunk's bytes are
# laid out as [K|V, 1 layer, 256 tokens, hidden] float16 with hidden chosen to give the chunk size.
LMCACHE_DRIVER = r"""
import json, os, statistics, sys, time, uuid
import numpy as np
import torch
from lmcache.v1.distributed.api import MemoryLayoutDesc
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey, RegisterEngineDrivenContextPayload
from lmcache.v1.multiprocess.transfer_context.base import EngineDrivenContextMetadata, create_engine_driven_context
from lmcache.v1.multiprocess.transport.zmq_impl import create_request_client

cfg = json.loads(sys.argv[1])
size, batch, tokens = cfg["size"], cfg["batch"], cfg["chunk_tokens"]
repeat, warmup, calls = cfg["repeat"], cfg["warmup"], cfg["calls"]
hidden = size // (2 * tokens * 2)
shape = torch.Size([2, 1, tokens, hidden])
client = create_request_client(cfg["url"])
iid, model = os.getpid(), "peers-%d" % size
reg = client.register_kv_cache_engine_driven_context(RegisterEngineDrivenContextPayload(
    instance_id=iid, model_name=model, world_size=1, block_size=tokens, num_layers=1, hidden_dim_size=hidden,
    dtype_str="float16", use_mla=False, num_physical_slots=tokens)).result(timeout=60)
meta = EngineDrivenContextMetadata(layout_desc=MemoryLayoutDesc(shapes=[shape], dtypes=[torch.float16]),
                                   block_size=tokens, use_mla=False)
ctx = create_engine_driven_context(meta, client, 120.0, shm_name=reg.shm_name, pool_size=reg.pool_size)
rng = np.random.default_rng(size)
src = [torch.from_numpy(rng.integers(0, 255, size, dtype=np.uint8)).view(torch.float16).view(shape)
       for _ in range(batch)]
dst = [torch.zeros(shape, dtype=torch.float16) for _ in range(batch)]
seqs = [tuple(range(i * 1000003 + size, i * 1000003 + size + tokens * batch)) for i in range(warmup + repeat)]

def key(toks):
    return IPCCacheServerKey(model_name=model, world_size=1, worker_id=0, token_ids=toks, start=0,
                             end=len(toks), request_id=uuid.uuid4().hex, num_kv_readers=1)

def put(toks):
    k = key(toks)
    prepared = ctx.prepare_store(k, iid)
    if prepared is None:
        ok = ctx.commit_store(k, iid, src)
    else:
        bufs, idx = prepared
        for b, j in zip(bufs, idx):
            b.copy_(src[j])
        ok = ctx.commit_store(k, iid, [])
    assert ok, "store failed"

def lookup(k):
    client.lookup(k, 1).result(timeout=60)
    return client.wait_prefetch_status(k.request_id, 60.0).result(timeout=60)

def get():
    k = key(seqs[-1])
    lookup(k)
    views = ctx.prepare_retrieve(k, iid)
    assert views is not None and len(views) == batch, "retrieve missed"
    for v, d in zip(views, dst):
        d.copy_(v.view(shape))
    ctx.commit_retrieve(k, iid)
    client.end_session(k.request_id).result(timeout=60)

def timed(fn, arg_list):
    out = []
    for i, arg in enumerate(arg_list):
        t0 = time.perf_counter()
        fn(*arg)
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return statistics.median(out)

put_s = timed(put, [(t,) for t in seqs])
get_s = timed(get, [()] * (warmup + repeat))
assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(src, dst)), "bytes differ"
lat = []
for _ in range(calls + 1):
    k = key(seqs[-1])
    t0 = time.perf_counter()
    lookup(k)
    lat.append(time.perf_counter() - t0)
    client.free_lookup_locks(k, 1).result(timeout=60)
    client.end_session(k.request_id).result(timeout=60)
lat = sorted(lat[1:])
ctx.close()
print(json.dumps({"transfer": type(ctx).__name__, "put_s": put_s, "get_s": get_s,
                  "exists_p50_us": lat[len(lat) // 2] * 1e6,
                  "exists_p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6}))
"""


# LMCache's runtime dependencies that import without CUDA; its CUDA ones (cupy, cuda-python, cufile) and torch
# are left out: the virtualenv sees the system's CPU torch through --system-site-packages.
LMCACHE_DEPS = ["numba", "msgspec", "blake3", "sortedcontainers", "cachetools", "psutil", "py-cpuinfo", "pyyaml",
                "prometheus_client", "aiofiles", "aiofile", "safetensors", "setuptools_scm", "httpx", "fastapi",
                "uvicorn", "httptools", "opentelemetry-api", "opentelemetry-sdk",
                "opentelemetry-exporter-prometheus", "nvtx", "pyzmq", "redis", "aiohttp", "numpy"]


def install_lmcache(spec: str = "lmcache") -> None:
    """Create LMCache's own virtualenv: ``lmcache`` without its dependencies, then the non-CUDA ones."""
    if not (LMCACHE_VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(LMCACHE_VENV)], check=True)
    pip = [str(LMCACHE_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", spec], check=True)
    subprocess.run([*pip, *LMCACHE_DEPS], check=True)


def lmcache_status(quick: bool) -> str | None:
    """``None`` if LMCache's server is installed and worth starting, else why not."""
    exe = LMCACHE_VENV / "bin" / "lmcache"
    if not exe.exists():
        return f"not installed: no {exe} (python -m bench.peers --install-lmcache creates it)"
    if quick:
        return "not started in --quick (a cold start of its server takes ~45 s here)"
    return None


class LMCachePeer:
    """``lmcache server`` (multiprocess mode, engine-driven transfers over shared memory) from its virtualenv."""

    def __init__(self, workdir: Path, l1_gb: int):
        from harness.servers import ServerProcess, free_port
        workdir.mkdir(parents=True, exist_ok=True)
        self.port, http_port = free_port(), free_port()
        self.env = dict(os.environ, LMCACHE_DISABLE_BANNER="1", DO_NOT_TRACK="1", LMCACHE_TRACK_USAGE="false")
        argv = [str(LMCACHE_VENV / "bin" / "lmcache"), "server", "--host", "127.0.0.1", "--port", str(self.port),
                "--http-host", "127.0.0.1", "--http-port", str(http_port), "--chunk-size", "256",
                "--l1-size-gb", str(l1_gb), "--eviction-policy", "LRU",
                "--supported-transfer-mode", "engine_driven", "--shm-name", f"kvpeers_{os.getpid()}",
                "--disable-observability"]
        self.server = ServerProcess(argv, self.port, workdir / "lmcache.log", self.env)
        self.server.start(timeout=180)
        self.python = str(LMCACHE_VENV / "bin" / "python")

    def bench(self, data: Payloads, repeat: int, warmup: int, calls: int) -> dict:
        cfg = {"url": f"tcp://127.0.0.1:{self.port}", "size": data.size, "batch": len(data.src), "chunk_tokens": 256,
               "repeat": repeat, "warmup": warmup, "calls": min(calls, 500)}
        out = subprocess.run([self.python, "-c", LMCACHE_DRIVER, json.dumps(cfg)], capture_output=True, text=True,
                             timeout=600, env=self.env)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode or not lines:
            tail = (out.stderr.strip().splitlines() or ["?"])[-1]
            raise RuntimeError(f"LMCache driver failed: {tail}")
        return json.loads(lines[-1])

    def close(self):
        self.server.stop()
