"""Time to first token with a host-tier hit ÷ without, in the real vLLM engine, per model family.

    python -m bench.ttft_families [--repeats 5] [--hidden 512] [--layers 6] [--prompt-chunks 8] [--quick]

For each family (dense: Llama-shaped; mla: DeepSeek-V2-shaped, kv_lora_rank 512 + rope 64; sliding:
Gemma-3-shaped, sliding-window layers of window 64 and a full-attention layer, run by vLLM's hybrid
allocator as one KV cache group per layer), one CPU vLLM engine (the engine virtualenv, ``KVSTORE_VLLM_VENV``)
with the kvstore connector and vLLM's own prefix cache off runs, ``--repeats`` times interleaved: a fresh
prompt of ``--prompt-chunks`` chunks of 256 tokens plus one token (a miss: a full prefill, whose chunks are
saved to the daemon's DRAM), then the same prompt again (a host-tier hit: the chunks are loaded and one token
is computed; the CPU MLA backend computes over a loaded prefix only so). TTFT is the engine's time to the first
token of a one-token request; a hit must give the miss's token. The physical limit next to it: the bytes a
hit loads ÷ this machine's memcpy bandwidth, measured in the same run. Medians; the first pair warms up.

Writes bench/results/ttft-families-latest.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench._common import start_daemon, write_result
from harness.engines.vllm_real import CHUNK, ENGINE_SCRIPT, POOL, REPO, engine_python, prompts, skip_reason

FAMILIES = ("dense", "mla", "sliding")
NUM_BLOCKS = {"dense": 512, "mla": 4096, "sliding": 512}


def save_models(directory: str, hidden: int, layers: int) -> dict[str, str]:
    python = engine_python()
    assert python is not None
    paths = {}
    for family in FAMILIES:
        paths[family] = os.path.join(directory, f"bench-{family}")
        subprocess.run([python, str(ENGINE_SCRIPT), "save-model", paths[family], family, str(hidden), str(layers)],
                       check=True, env=POOL.env(), cwd=str(REPO), stdout=subprocess.DEVNULL, timeout=600)
    return paths


def memcpy_gbps(nbytes: int) -> float:
    """This machine's copy bandwidth over a buffer the size of one hit's chunks (the bound a load meets)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times) / 1e9


def measure(model: str, family: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = POOL.get(f"bench-{family}", model=model, connector=POOL.connector(), prefix_caching=False,
                      num_blocks=NUM_BLOCKS[family], max_model_len=8192)
    length = args.prompt_chunks * CHUNK + 1
    batch = prompts(args.repeats + 1, length, seed=FAMILIES.index(family) + 1)
    miss, hit = [], []
    for prompt in batch:
        before = engine.stats()
        a = engine.generate([prompt], 1)[0]
        b = engine.generate([prompt], 1)[0]
        loaded = (engine.stats().get("worker", {}).get("chunks_loaded", 0)
                  - before.get("worker", {}).get("chunks_loaded", 0))
        assert a["tokens"] == b["tokens"], f"{family}: a hit gave another first token"
        assert loaded == args.prompt_chunks, f"{family}: the hit loaded {loaded} chunks"
        miss.append(a["ttft"])
        hit.append(b["ttft"])
    POOL.keep()
    miss, hit = miss[1:], hit[1:]
    return {"miss_s": statistics.median(miss), "hit_s": statistics.median(hit),
            "hit_over_miss": statistics.median(hit) / statistics.median(miss), "miss_samples": miss,
            "hit_samples": hit}


def hit_bytes(family: str, args: argparse.Namespace) -> int:
    tokens = args.prompt_chunks * CHUNK
    if family == "mla":
        return (args.layers - 1) * tokens * 576 * 4
    if family == "sliding":
        return args.layers * 2 * tokens * 2 * 64 * 4
    return args.layers * 2 * tokens * 2 * (args.hidden // 4) * 4


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--prompt-chunks", type=int, default=8)
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--quick", action="store_true", help="2 repeats of 2-chunk prompts")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.prompt_chunks = 2, 2
    if engine_python() is None:
        print(skip_reason(), file=sys.stderr)
        return 2
    daemon = start_daemon("--host-mem", "4GiB", tcp=False)
    POOL.use_workdir(daemon.workdir)
    results: dict[str, Any] = {}
    try:
        models = save_models(daemon.workdir, args.hidden, args.layers)
        for family in args.families.split(","):
            nbytes = hit_bytes(family, args)
            found = measure(models[family], family, args)
            found.update(bytes_per_hit=nbytes, memcpy_s=nbytes / (memcpy_gbps(nbytes) * 1e9))
            results[family] = found
            print(family, {k: v for k, v in found.items() if not k.endswith("samples")}, flush=True)
    finally:
        POOL.close()
        daemon.stop()
    path = write_result("ttft-families", {"repeats": args.repeats, "hidden": args.hidden, "layers": args.layers,
                                          "prompt_tokens": args.prompt_chunks * CHUNK + 1, "families": results},
                        quick=args.quick)
    print(f"{'family':8} {'miss s':>8} {'hit s':>8} {'hit/miss':>9} {'MiB/hit':>8} {'memcpy s':>9}")
    for family, r in results.items():
        print(f"{family:8} {r['miss_s']:8.3f} {r['hit_s']:8.3f} {r['hit_over_miss']:9.3f} "
              f"{r['bytes_per_hit'] / 2**20:8.1f} {r['memcpy_s']:9.4f}")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
