"""The ``daemon_tiers`` sub-check of ``bench/gpu_check.py``: a daemon with all three tiers, on a GPU.

Kept out of ``gpu_check.py`` (which passes in the device, the child environment, its list of child processes
and its paged-cache helper, as it does for ``vllm_gpu_check.py``) so that each file stays one idea: the check
runner there, this one check here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def serve_flags(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-m", "kvstore", "serve", "--help"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=60)
    return out.stdout


def disk_args(help_text: str, workdir: str) -> list[str]:
    """Disk-tier flags of this build, found in ``serve --help`` (the disk tier may not be merged yet)."""
    args = []
    for flag in ("--disk-path", "--disk-dir", "--disk"):
        if re.search(rf"{flag}\b", help_text):
            args += [flag, os.path.join(workdir, "disk")]
            break
    for flag in ("--disk-size", "--disk-mem", "--disk-capacity"):
        if re.search(rf"{flag}\b", help_text):
            args += [flag, "1GiB"]
            break
    return args


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def check_daemon_tiers(r: dict, device: str, env: dict[str, str], children: list[subprocess.Popen],
                       vllm_cache: Callable[..., Any], kill_children: Callable[[], None]) -> None:
    """A daemon with all three tiers (on --cpu-dry-run its GPU tier is the CPU-backed test tier). Chunks of a
    vLLM paged cache go in through the host tier, rise to the GPU tier on repeated hits (read back as views of
    the mapped pool), sink to disk under DRAM pressure and out of the GPU tier past its high watermark, and every
    chunk read back into another paged cache is compared byte for byte."""
    import torch

    import kvstore
    from kvstore.ops import PagedKV, gather, scatter

    workdir = tempfile.mkdtemp(prefix="kvs-gpu-")
    sock = os.path.join(workdir, "kv.sock")
    help_text = serve_flags(env)
    gpu = ["--gpu-mem", "64MiB", "--gpu-device", "0"]
    env = dict(env)
    from harness.daemons import sandbox_dirs  # HOME and XDG dirs in the workdir: defaults never reach the user's

    env.update(sandbox_dirs(workdir))
    args = ["--socket", sock, "--host-mem", "128MiB", *gpu, "--log-level", "info", *disk_args(help_text, workdir)]
    r["daemon_args"] = args
    log = open(os.path.join(workdir, "daemon.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "kvstore", "serve", *args], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    children.append(proc)
    try:
        deadline = time.monotonic() + 60
        client = None
        while time.monotonic() < deadline and client is None:
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {proc.returncode}: {open(log.name).read()[-2000:]}")
            try:
                client = kvstore.connect("ipc://" + sock, namespace="gpu-check", chunk_tokens=256, timeout=10,
                                         gpu=True)
                client.ping()
            except Exception:  # noqa: BLE001 - not up yet
                client = None
                time.sleep(0.2)
        if client is None:
            raise RuntimeError("daemon did not answer within 60 s")
        r["hello_gpu"] = bool(client.server_info.get("gpu"))
        r["pool_mapped"] = client.gpu_pool is not None
        r["pool_device"] = str(client.gpu_pool.device) if client.gpu_pool is not None else None
        # 8 layers x 8 heads x 128, bf16, 16-token blocks: 8 MiB a 256-token chunk; 40 chunks = 320 MiB,
        # more than the GPU (64 MiB) and host (128 MiB) tiers hold together, so chunks must sink to disk.
        caches = vllm_cache(8, 640, 16, 8, 128)
        kv = PagedKV.from_vllm(caches)
        n_chunks = 40
        tokens = list(range(256 * n_chunks))
        keys = client.chunk_keys(tokens)
        perm = torch.randperm(640).to(device)
        block_sets = [perm[i * 16:(i + 1) * 16] for i in range(n_chunks)]
        targets = vllm_cache(8, 640, 16, 8, 128, fill=False)
        dst = PagedKV.from_vllm(targets)
        tiers_read: dict[str, int] = {}

        def read_back(first: int, count: int) -> int:
            equal = 0
            for i in range(first, first + count):
                lease = client.get([keys[i]])
                with lease:
                    if not lease.views:
                        break
                    view, tier = lease.views[0], lease.tiers[0]
                    tiers_read[tier] = tiers_read.get(tier, 0) + 1
                    if tier == "gpu":
                        assert isinstance(view, torch.Tensor) and view.device == client.gpu_pool.device
                    chunk = view if isinstance(view, torch.Tensor) else torch.frombuffer(view, dtype=torch.uint8)
                    scatter(dst, chunk, block_sets[i])
                    if device == "cuda":
                        torch.cuda.synchronize()
                equal += bool(torch.equal(gather(dst, block_sets[i]), gather(kv, block_sets[i])))
            return equal

        def promote(first: int, count: int) -> bool:
            """Two gets each (the second asks for promotion), then wait for the GPU tier to hold them."""
            for _ in range(2):
                for i in range(first, first + count):
                    with client.get([keys[i]]):
                        pass
            return wait_until(lambda: client.lookup_tiers(keys[:first + count]).tiers.get("gpu", 0) >= min(
                count, 6), 10)   # 64 MiB: past 7 chunks the high watermark brings it back to 6

        # First a set that fits in the host tier alone: the plain round trip, whatever the tier manager does.
        client.put(keys[:4], [gather(kv, block_sets[j]) for j in range(4)])
        r["first_4_chunks_equal"] = read_back(0, 4)
        r["first_4_promoted"] = promote(0, 4)
        r["first_4_from_gpu_equal"] = read_back(0, 4)
        for i in range(4, n_chunks, 4):  # several puts, each a chain continuation: DRAM pressure sends chunks to disk
            chunk_list = [gather(kv, block_sets[j]) for j in range(i, i + 4)]
            client.put(keys[i:i + 4], chunk_list, parent=keys[i - 1])
        r["next_8_promoted"] = promote(4, 8)  # 12 x 8 MiB passes the 64 MiB tier's high watermark: demotions
        found = client.lookup_tiers(keys)
        r["lookup_count"] = found.count
        r["tiers_seen"] = found.tiers
        equal = read_back(0, found.count)
        r["chunks_equal"] = equal
        r["tiers_read"] = tiers_read
        stats = client.stats()
        r["stats_tiers"] = stats.get("tiers")
        r["moves"] = {k: v for k, v in stats.get("counters", {}).items()
                      if k.startswith(("promotions_", "demotions_", "gpu_copies"))}
        client.close()
        tiers = set((stats.get("tiers") or {}).keys())
        r["all_three_tiers"] = {"gpu", "host", "disk"} <= tiers
        moved = r["moves"]
        r["ok"] = (r["first_4_chunks_equal"] == 4 and r["first_4_from_gpu_equal"] == 4 and r["pool_mapped"]
                   and found.count == n_chunks and equal == found.count and r["all_three_tiers"]
                   and tiers_read.get("gpu", 0) > 0 and moved.get("promotions_host_gpu", 0) > 0
                   and moved.get("promotions_disk_host", 0) > 0
                   and moved.get("demotions_gpu_host", 0) + moved.get("demotions_gpu_disk", 0) > 0)
        if not r["all_three_tiers"]:
            r["error"] = f"daemon reports tiers {sorted(tiers)}; expected gpu, host and disk"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                kill_children()
        log.close()
        r["daemon_log_tail"] = open(log.name, errors="replace").read()[-3000:]
        shutil.rmtree(workdir, ignore_errors=True)
