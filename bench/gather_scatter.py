"""Gather/scatter on CPU tensors: the torch path against the native C path, next to a plain memcpy.

    python -m bench.gather_scatter [--out bench/results/gather_scatter_cpu.json] [--reps 15]

Shapes: a Llama-3-8B-like cache (32 layers, 8 KV heads × 128, bf16, 16-token blocks, 256-token chunks:
32 MiB a chunk) and a small model (4 layers, 2 × 64, 16-token blocks: 128 KiB a chunk), where per-call
overhead dominates. Blocks are picked at random from the cache. Reports medians in ms and GB/s; the JSON's
``winner`` fields decide ``kvstore.ops.registry.DEFAULTS['cpu']``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import torch

from kvstore import native
from kvstore.ops import PagedKV, gather, registry, scatter

from bench._common import median_seconds

SHAPES = {
    "llama3_8b": dict(layers=32, blocks=80, block_size=16, heads=8, dim=128, chunk_tokens=256),
    "small": dict(layers=4, blocks=256, block_size=16, heads=2, dim=64, chunk_tokens=256),
}


def median_ms(fn, reps: int) -> float:
    return median_seconds(fn, reps) * 1e3


def bench_shape(name: str, shape: dict, reps: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    caches = [torch.randn(2, shape["blocks"], shape["block_size"], shape["heads"], shape["dim"],
                          generator=gen).to(torch.bfloat16) for _ in range(shape["layers"])]
    kv = PagedKV.from_vllm(caches)
    n_blocks = shape["chunk_tokens"] // shape["block_size"]
    ids = torch.randperm(shape["blocks"], generator=gen)[:n_blocks].tolist()
    nbytes = kv.chunk_shape(shape["chunk_tokens"]).nbytes
    out = torch.empty(nbytes, dtype=torch.uint8)
    src = out.clone()
    result = {"chunk_bytes": nbytes, "memcpy_ms": median_ms(lambda: out.copy_(src), reps)}
    for impl in ("torch", "native"):
        k = registry.select(torch.device("cpu"), impl)
        # each lambda is timed within its iteration, so binding the loop's kernels late is right
        result[f"{impl}_gather_ms"] = median_ms(lambda: gather(kv, ids, out=out, kernels=k), reps)  # noqa: B023
        result[f"{impl}_scatter_ms"] = median_ms(lambda: scatter(kv, src, ids, kernels=k), reps)  # noqa: B023
    for op in ("gather", "scatter"):
        for impl in ("torch", "native"):
            result[f"{impl}_{op}_GBps"] = round(nbytes / result[f"{impl}_{op}_ms"] / 1e6, 2)
        result[f"{op}_native_speedup"] = round(result[f"torch_{op}_ms"] / result[f"native_{op}_ms"], 3)
        result[f"{op}_winner"] = "native" if result[f"native_{op}_ms"] < result[f"torch_{op}_ms"] else "torch"
    result["memcpy_GBps"] = round(nbytes / result["memcpy_ms"] / 1e6, 2)
    for key in list(result):
        if key.endswith("_ms"):
            result[key] = round(result[key], 4)
    print(f"{name:10s} chunk {nbytes / 2**20:7.2f} MiB  "
          f"gather torch {result['torch_gather_ms']:.3f} ms / native {result['native_gather_ms']:.3f} ms  "
          f"scatter torch {result['torch_scatter_ms']:.3f} ms / native {result['native_scatter_ms']:.3f} ms  "
          f"memcpy {result['memcpy_ms']:.3f} ms")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "gather_scatter_cpu.json"))
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    if native.load("copy") is None:
        print(f"native C path not built ({native.library_path('copy')}): python setup.py build_ext --inplace",
              file=sys.stderr)
        return 1
    report = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "reps": args.reps,
        "shapes": {name: bench_shape(name, shape, args.reps) for name, shape in SHAPES.items()},
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
