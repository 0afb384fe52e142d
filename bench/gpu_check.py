"""GPU check: one command that exercises the GPU tier, the native CUDA kernels and the pinned host arena on a
real GPU, measures bandwidths next to their limits, and writes everything as JSON.

    PYTHONPATH=/path/to/wheels python3 -m bench.gpu_check --out "$OUT"

Needs only the packages of a stock GPU image (torch with CUDA, setuptools and a C compiler) plus pyzmq and lz4
on PYTHONPATH, and cupy for the native CUDA kernel (without it ``native_build`` and ``kernels`` fail, the other
checks run); kvstore need not be installed: run from the repository root, which ``python3 -m`` puts on
sys.path (and this script on every child's PYTHONPATH), the C libraries are built in place as an editable
install builds them, and the daemon runs as ``python3 -m kvstore`` from the repository root.

Every sub-check runs on its own; a failure is recorded (with its traceback) and the next one runs. The JSON is
rewritten after each sub-check, and an alarm stops the whole run after ``--budget`` seconds (default 285) and
still writes what was measured, so the command never hangs. Sub-checks:

  env            GPU, torch, CUDA, memlock limit, compiler
  native_build   build the C libraries as an install does (setup.py build_ext --inplace) and compile
                 native/kvstore_copy.cu for this GPU through cupy (seconds each; needs cupy)
  kernels        native CUDA gather/scatter equal to the torch path (vLLM FlashAttention + FlashInfer layouts)
  hbm_tier       the HBM pool exported by CUDA IPC from another process, mapped here; bandwidth of
                 pool → vLLM paged cache (scatter) against a plain device-to-device copy of the same bytes
                 (target >= 0.5x)
  pinned_host    the shared arena page-locked with cudaHostRegister; bandwidth of arena → GPU and of
                 arena → paged cache against torch's pinned host-to-device copy (target >= 0.8x)
  daemon_tiers   a daemon with --gpu-mem, the host tier and the disk tier; chunks of a vLLM paged cache on cuda
                 put, promoted to the GPU tier on repeated hits (read back as CUDA IPC views of its pool), sunk to
                 disk and out of the GPU tier past its watermark, and read back into another paged cache, bytes
                 compared (--cpu-dry-run: the CPU-backed test tier, KVSTORE_GPU_TIER_DEVICE=cpu)
  hf_e2e         the HuggingFace end-to-end test on cuda (KVSTORE_TEST_DEVICE=cuda)
  vllm_worker    the vLLM connector's worker path (bench/vllm_gpu_check.py): how long saving N chunks blocks
                 the step (target < 5 % of the copy time), load bandwidth into the paged cache from the pinned
                 arena and from the GPU tier, against torch's pinned host-to-device and device-to-device copies
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RESULTS: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "checks": {}}
CHILDREN: list[subprocess.Popen] = []
OUT_PATH = ""
DEVICE = "cuda"  # "cpu" with --cpu-dry-run: exercises the script's own logic on a machine without a GPU


def child_env(**extra: str) -> dict[str, str]:
    paths = [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


def save() -> None:
    RESULTS["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    tmp = OUT_PATH + ".tmp"
    with open(tmp, "w") as f:
        json.dump(RESULTS, f, indent=2, default=str)
    os.replace(tmp, OUT_PATH)


def kill_children() -> None:
    for proc in CHILDREN:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass


def run_check(name: str, fn: Callable[[dict], None]) -> None:
    record: dict[str, Any] = {}
    RESULTS["checks"][name] = record
    start = time.monotonic()
    try:
        fn(record)
        record["ok"] = bool(record.get("ok", True))
        if not record["ok"] and "error" not in record:
            record["error"] = "a target or comparison failed (see the fields)"
    except Exception as exc:  # noqa: BLE001 - record and go on, unless the overall budget is spent
        record["ok"] = False
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()[-3000:]
        if RESULTS.get("timed_out"):
            record["seconds"] = round(time.monotonic() - start, 2)
            raise TimeoutError(record["error"]) from None
    record["seconds"] = round(time.monotonic() - start, 2)
    print(f"[{'ok' if record['ok'] else 'FAIL':4s}] {name:13s} {record['seconds']:7.2f}s  "
          f"{summary_of(record)}", flush=True)
    save()


def summary_of(record: dict) -> str:
    keys = [k for k in record if k.endswith(("_ratio", "_GBps", "gpu", "error", "tiers_seen", "passed"))]
    return "  ".join(f"{k}={record[k]}" for k in keys)[:400]


# -- measuring ----------------------------------------------------------------------------------------------
def cuda_time_ms(fn: Callable[[], Any], reps: int = 20) -> float:
    import torch

    if DEVICE == "cpu":  # --cpu-dry-run: wall clock
        fn()
        samples = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def gbps(nbytes: int, ms: float) -> float:
    return round(nbytes / ms / 1e6, 2)


def vllm_cache(layers: int, blocks: int, block_size: int, heads: int, dim: int, kv_first: bool = True,
               fill: bool = True) -> list:
    import torch

    shape = (2, blocks, block_size, heads, dim) if kv_first else (blocks, 2, block_size, heads, dim)
    make = torch.randn if fill else torch.zeros
    return [make(shape, device=DEVICE, dtype=torch.bfloat16) for _ in range(layers)]


# -- checks -------------------------------------------------------------------------------------------------
def check_env(r: dict) -> None:
    import torch

    from kvstore.mapped.page_lock import memlock_limit

    r["python"] = platform.python_version()
    r["torch"] = torch.__version__
    r["torch_cuda"] = torch.version.cuda
    r["cuda_available"] = torch.cuda.is_available()
    if not torch.cuda.is_available():
        r["ok"] = False
        r["error"] = "torch.cuda.is_available() is False"
        return
    props = torch.cuda.get_device_properties(0)
    r["gpu"] = props.name
    r["capability"] = f"{props.major}.{props.minor}"
    r["gpu_memory_bytes"] = props.total_memory
    r["memlock_limit"] = memlock_limit()
    r["nvcc"] = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
    try:
        import cupy
        r["cupy"] = cupy.__version__
    except Exception:  # noqa: BLE001
        r["cupy"] = None
    RESULTS["gpu"] = props.name
    r["ok"] = True


def build_c_libraries(r: dict) -> None:
    """The C libraries, built in place as ``pip install -e .`` builds them (this script runs from a checkout)."""
    start = time.monotonic()
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    r["c_seconds"] = round(time.monotonic() - start, 2)
    from kvstore import native

    native.forget()
    r["c_native"] = native.describe()
    if out.returncode != 0:
        r["c_error"] = out.stderr[-2000:]


def check_native_build(r: dict) -> None:
    import torch

    from kvstore.native import cuda

    build_c_libraries(r)
    kernels = cuda.module()
    if kernels is None:
        r["ok"], r["error"] = False, "the CUDA kernel needs cupy: pip install 'kvstore[gpu]' (cupy-cuda12x)"
        return
    start = time.monotonic()
    try:
        kernels.functions(torch.cuda.current_device())
    except RuntimeError as exc:
        r["ok"], r["error"] = False, str(exc)
        return
    r["cuda_seconds"] = round(time.monotonic() - start, 2)   # the NVRTC compile (or cupy's cache hit)
    r["ok"] = True


def check_kernels(r: dict) -> None:
    import torch

    from kvstore.ops import PagedKV, gather, registry, scatter

    dev = torch.device(DEVICE)
    nat, tor = registry.select(dev, "native"), registry.TORCH
    r["default"] = registry.select(dev).name
    for kv_first in (True, False):
        caches = vllm_cache(4, 64, 16, 8, 128, kv_first)
        kv = PagedKV.from_vllm(caches)
        ids = torch.randperm(64).to(dev)[:16]
        a, b = gather(kv, ids, kernels=nat), gather(kv, ids, kernels=tor)
        tag = "flash_attn" if kv_first else "flashinfer"
        r[f"{tag}_gather_equal"] = bool(torch.equal(a, b))
        targets = vllm_cache(4, 64, 16, 8, 128, kv_first, fill=False)
        scatter(PagedKV.from_vllm(targets), a, ids, kernels=nat)
        back = gather(PagedKV.from_vllm(targets), ids, kernels=tor)
        r[f"{tag}_scatter_equal"] = bool(torch.equal(back, b))
    # timing: native vs torch on a Llama-3-8B-like chunk (32 layers, 8 x 128, bf16, 256 tokens = 32 MiB)
    caches = vllm_cache(32, 128, 16, 8, 128)
    kv = PagedKV.from_vllm(caches)
    ids = torch.randperm(128).to(dev)[:16]
    out = torch.empty(kv.chunk_shape(256).nbytes, dtype=torch.uint8, device=dev)
    for name, k in (("native", nat), ("torch", tor)):   # each lambda is timed within its iteration
        r[f"{name}_gather_GBps"] = gbps(out.numel(), cuda_time_ms(lambda: gather(kv, ids, out=out, kernels=k)))  # noqa: B023
        r[f"{name}_scatter_GBps"] = gbps(out.numel(), cuda_time_ms(lambda: scatter(kv, out, ids, kernels=k)))  # noqa: B023
    r["ok"] = all(v for k, v in r.items() if k.endswith("_equal"))


PRODUCER = """
import json, sys, torch
from kvstore.tiers.gpu.tier import GpuTier
tier = GpuTier(int(sys.argv[1]), "cuda:0")
slot = tier.allocate(int(sys.argv[2]))
gen = torch.Generator(device="cuda").manual_seed(1234)
pattern = torch.randint(0, 256, (int(sys.argv[2]),), dtype=torch.uint8, device="cuda", generator=gen)
tier.write(slot, pattern)
torch.cuda.synchronize()
info = tier.hello_info()
info["share"] = [x.hex() if isinstance(x, bytes) else x for x in info["share"]]
print(json.dumps({"slot": slot, "info": info}), flush=True)
sys.stdin.readline()
"""


def check_hbm_tier(r: dict) -> None:
    import torch

    from kvstore.mapped.gpu_pool import MappedPool
    from kvstore.ops import PagedKV, registry, scatter

    chunk_bytes = 32 << 20
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, str(1 << 30), str(chunk_bytes)], env=child_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    CHILDREN.append(proc)
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"producer process exited with {proc.wait(30)}")
        msg = json.loads(line)
        info = msg["info"]
        info["share"] = [bytes.fromhex(x) if isinstance(x, str) else x for x in info["share"]]
        pool = MappedPool.from_hello(info)
        if pool is None:
            raise RuntimeError("MappedPool.from_hello returned None (see the gpu_pool_unmapped log line)")
        chunk = pool.view(msg["slot"], chunk_bytes)
        gen = torch.Generator(device="cuda").manual_seed(1234)
        expected = torch.randint(0, 256, (chunk_bytes,), dtype=torch.uint8, device="cuda", generator=gen)
        r["ipc_bytes_equal"] = bool(torch.equal(chunk, expected))
        r["pinned_host_in_producer"] = info.get("pinned_host")
        # pool -> paged cache (32 layers x 8 heads x 128, bf16, 16-token blocks, 256 tokens = 32 MiB)
        caches = vllm_cache(32, 128, 16, 8, 128, fill=False)
        kv = PagedKV.from_vllm(caches)
        ids = torch.randperm(128, device="cuda")[:16]
        for name in ("native", "torch"):
            k = registry.select(torch.device("cuda"), name)
            timed = cuda_time_ms(lambda: scatter(kv, chunk, ids, kernels=k))  # noqa: B023 - timed here
            r[f"pool_to_paged_{name}_GBps"] = gbps(chunk_bytes, timed)
        scatter(kv, chunk, ids)
        from kvstore.ops import gather
        r["paged_bytes_equal"] = bool(torch.equal(gather(kv, ids), expected))
        dst = torch.empty(chunk_bytes, dtype=torch.uint8, device="cuda")
        r["d2d_copy_GBps"] = gbps(chunk_bytes, cuda_time_ms(lambda: dst.copy_(chunk)))
        best = max(r["pool_to_paged_native_GBps"], r["pool_to_paged_torch_GBps"])
        r["pool_to_paged_vs_d2d_ratio"] = round(r["pool_to_paged_native_GBps"] / r["d2d_copy_GBps"], 3)
        r["best_vs_d2d_ratio"] = round(best / r["d2d_copy_GBps"], 3)
        r["target_ratio"] = 0.5
        r["ok"] = r["ipc_bytes_equal"] and r["paged_bytes_equal"] and r["pool_to_paged_vs_d2d_ratio"] >= 0.5
    finally:
        try:
            proc.stdin.write("quit\n")
            proc.stdin.flush()
            proc.wait(20)
        except Exception:  # noqa: BLE001
            kill_children()


def check_pinned_host(r: dict) -> None:
    import torch

    from kvstore.mapped.page_lock import page_lock
    from kvstore.tiers.gpu.tier import host_tensor
    from kvstore.ops import PagedKV, scatter
    from kvstore.mapped.arena import SharedArena

    nbytes = 1 << 30
    chunk_bytes = 32 << 20
    arena = SharedArena.create(f"/dev/shm/kvstore-gpucheck-{os.getpid()}.arena", nbytes)
    try:
        start = time.monotonic()
        region = page_lock(arena.buf, nbytes, who="gpu_check")
        r["register_seconds"] = round(time.monotonic() - start, 3)
        r["arena_pinned"] = region.locked
        r["pin_reason"] = region.reason
        host = host_tensor(arena.buf, nbytes)
        r["torch_sees_pinned"] = bool(host.is_pinned())
        src = host[64 << 20:(64 << 20) + chunk_bytes]
        src.copy_(torch.randint(0, 256, (chunk_bytes,), dtype=torch.uint8))
        dst = torch.empty(chunk_bytes, dtype=torch.uint8, device="cuda")
        # the lambdas run before the `del host, src` below (which pyflakes reads as leaving src unbound in them)
        r["arena_h2d_GBps"] = gbps(chunk_bytes, cuda_time_ms(lambda: dst.copy_(src, non_blocking=True)))  # noqa: F821
        ref_src = torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True)
        ref_src.copy_(src)
        r["torch_pinned_h2d_GBps"] = gbps(chunk_bytes, cuda_time_ms(lambda: dst.copy_(ref_src, non_blocking=True)))
        caches = vllm_cache(32, 128, 16, 8, 128, fill=False)
        kv = PagedKV.from_vllm(caches)
        ids = torch.randperm(128, device="cuda")[:16]
        r["arena_to_paged_GBps"] = gbps(chunk_bytes, cuda_time_ms(lambda: scatter(kv, src, ids)))  # noqa: F821
        r["arena_h2d_vs_torch_pinned_ratio"] = round(r["arena_h2d_GBps"] / r["torch_pinned_h2d_GBps"], 3)
        r["arena_to_paged_vs_torch_pinned_ratio"] = round(r["arena_to_paged_GBps"] / r["torch_pinned_h2d_GBps"], 3)
        r["target_ratio"] = 0.8
        from kvstore.ops import gather
        r["paged_bytes_equal"] = bool(torch.equal(gather(kv, ids).cpu(), src))
        r["ok"] = (region.locked and r["paged_bytes_equal"] and r["arena_h2d_vs_torch_pinned_ratio"] >= 0.8
                   and r["arena_to_paged_vs_torch_pinned_ratio"] >= 0.8)
        del host, src
        torch.cuda.synchronize()
        region.unlock()
    finally:
        arena.close()


def check_vllm_worker(r: dict) -> None:
    from bench.vllm_gpu_check import check_vllm_worker as check

    check(r, DEVICE, child_env(), CHILDREN, cuda_time_ms)


def check_daemon_tiers(r: dict) -> None:
    """A daemon with all three tiers (``bench/tiers_gpu_check.py``)."""
    from bench.tiers_gpu_check import check_daemon_tiers as check

    env = child_env(KVSTORE_GPU_TIER_DEVICE="cpu") if DEVICE == "cpu" else child_env()
    check(r, DEVICE, env, CHILDREN, vllm_cache, kill_children)


def check_hf_e2e(r: dict, timeout: float) -> None:
    hf_dir = os.path.join("tests", "connectors", "hf")
    tests = sorted(os.path.join(hf_dir, f) for f in os.listdir(os.path.join(ROOT, hf_dir))
                   if f.startswith("test_") and re.search(r"(^|_)(hf|huggingface|transformers)", f[5:]))
    r["tests"] = tests
    if not tests:
        r["ok"] = False
        r["error"] = "no HuggingFace end-to-end test file (tests/connectors/hf_connector/test_*hf*.py) in this tree"
        return
    code = ("import sys, pytest\n"
                   f"sys.exit(pytest.main(['-q', '-x', '-p', 'no:cacheprovider', *{tests!r}]))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=child_env(KVSTORE_TEST_DEVICE=DEVICE),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    CHILDREN.append(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_children()
        out, _ = proc.communicate()
        r["error"] = f"timed out after {timeout:.0f} s"
    r["returncode"] = proc.returncode
    r["output_tail"] = (out or "")[-3000:]
    m = re.search(r"(\d+) passed", out or "")
    r["passed"] = int(m.group(1)) if m else 0
    r["ok"] = proc.returncode == 0


def main() -> int:
    global OUT_PATH
    parser = argparse.ArgumentParser(description="kvstore GPU check")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"),
                        help="directory for gpu_check.json (default bench/results)")
    parser.add_argument("--budget", type=float, default=285.0, help="overall time limit in seconds")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="no GPU: run the checks that can run on CPU, to test this script itself")
    args = parser.parse_args()
    global DEVICE
    DEVICE = "cpu" if args.cpu_dry_run else "cuda"
    os.makedirs(args.out, exist_ok=True)
    OUT_PATH = os.path.join(args.out, "gpu_check.json")
    os.environ.setdefault("KVSTORE_NATIVE_DIR", tempfile.mkdtemp(prefix="kvstore-native-"))
    started = time.monotonic()

    def on_alarm(signum: int, frame: Any) -> None:
        RESULTS["timed_out"] = True
        kill_children()
        raise TimeoutError(f"overall budget of {args.budget:.0f} s spent")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(args.budget))
    try:
        run_check("env", check_env)
        if args.cpu_dry_run:
            build_c_libraries(RESULTS["checks"]["env"])
            run_check("kernels", check_kernels)
            run_check("daemon_tiers", check_daemon_tiers)
            run_check("hf_e2e", lambda r: check_hf_e2e(r, 120))
            run_check("vllm_worker", check_vllm_worker)
        elif RESULTS["checks"]["env"].get("cuda_available"):
            run_check("native_build", check_native_build)
            run_check("kernels", check_kernels)
            run_check("hbm_tier", check_hbm_tier)
            run_check("pinned_host", check_pinned_host)
            run_check("daemon_tiers", check_daemon_tiers)
            run_check("vllm_worker", check_vllm_worker)
            left = args.budget - (time.monotonic() - started) - 10
            run_check("hf_e2e", lambda r: check_hf_e2e(r, max(10.0, left)))
    except TimeoutError as exc:
        RESULTS["error"] = str(exc)
    finally:
        signal.alarm(0)
        kill_children()
        RESULTS["seconds"] = round(time.monotonic() - started, 1)
        RESULTS["ok"] = bool(RESULTS["checks"]) and all(c.get("ok") for c in RESULTS["checks"].values())
        save()
    print(f"{'PASS' if RESULTS['ok'] else 'FAIL'} in {RESULTS['seconds']} s; wrote {OUT_PATH}")
    return 0 if RESULTS["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
