"""Time to first token with a host-tier hit ÷ plain prefill on a hybrid model, and the state's share of a chunk.

    python -m bench.ttft_hybrid [--repeats 5] [--hidden 512] [--layers 6] [--prompt-chunks 8] [--quick]

The model is Granite 4 (GraniteMoeHybrid) shaped: Mamba-2 and attention layers in turn, random float32 weights
(``tests/support/engines/vllm_engine.py``, family ``hybrid-mamba2``). Two CPU vLLM engines (the engine
virtualenv, ``KVSTORE_VLLM_VENV``), both pinned to one reserved core (``VLLM_CPU_NUM_OF_RESERVED_CPU=1``):

* plain: no connector, no prefix caching, the whole prompt prefilled in one step;
* kvstore: the connector with vLLM's prefix caching in align mode (a state only exists there), a token budget
  of one 256-token block a step and one request at a time (what vLLM's CPU Mamba scan needs in align mode).

Per repeat, a fresh prompt of ``--prompt-chunks`` chunks of 256 tokens plus one token runs on the plain engine
(plain prefill), then on the kvstore engine (a miss: prefilled block by block, its chunks and states saved to
the daemon's DRAM), and again on the kvstore engine after vLLM forgot its own cache (a hit: every chunk's
attention KV and the last chunk's state loaded, one token computed). TTFT is the engine's time to the first
token of a one-token request; the hit must give plain prefill's token. Medians; the first repeat warms up.
The state's share of the bytes stored per chunk is the engine's own chunk layout (``chunk_parts``).

Writes bench/results/ttft-hybrid-latest.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from typing import Any

from bench._common import start_daemon, write_result
from tests.support.engines.vllm_real import CHUNK, ENGINE_SCRIPT, POOL, REPO, engine_python, prompts, skip_reason

FAMILY = "hybrid-mamba2"
PINNED = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}


def save_model(directory: str, hidden: int, layers: int) -> str:
    python = engine_python()
    assert python is not None
    path = os.path.join(directory, f"bench-{FAMILY}")
    subprocess.run([python, str(ENGINE_SCRIPT), "save-model", path, FAMILY, str(hidden), str(layers)],
                   check=True, env=POOL.env(), cwd=str(REPO), stdout=subprocess.DEVNULL, timeout=600)
    return path


def measure(model: str, args: argparse.Namespace) -> dict[str, Any]:
    common = {"model": model, "num_blocks": 4 * (args.prompt_chunks + 2), "env": PINNED, "max_model_len": 8192}
    plain = POOL.get("bench-hybrid-plain", prefix_caching=False, **common)
    store = POOL.get("bench-hybrid-kvstore", connector=POOL.connector(), max_num_batched_tokens=CHUNK,
                     max_num_seqs=1, **common)
    parts = store.chunk_parts()
    batch = prompts(args.repeats + 1, args.prompt_chunks * CHUNK + 1, seed=7)
    plain_s, miss_s, hit_s = [], [], []
    for prompt in batch:
        want = plain.generate([prompt], 1)[0]
        miss = store.generate([prompt], 1)[0]
        store.reset_prefix_cache()
        before = store.stats().get("worker", {}).get("chunks_loaded", 0)
        hit = store.generate([prompt], 1)[0]
        loaded = store.stats().get("worker", {}).get("chunks_loaded", 0) - before
        assert loaded == args.prompt_chunks, f"the hit loaded {loaded} chunks, not {args.prompt_chunks}"
        assert hit["tokens"] == want["tokens"] == miss["tokens"], "a hit gave another first token"
        store.reset_prefix_cache()
        plain_s.append(want["ttft"])
        miss_s.append(miss["ttft"])
        hit_s.append(hit["ttft"])
    POOL.keep()
    plain_s, miss_s, hit_s = plain_s[1:], miss_s[1:], hit_s[1:]
    chunk_bytes = sum(p["nbytes"] for p in parts)
    state_bytes = sum(p["nbytes"] for p in parts if p["kind"] == "state")
    return {"plain_s": statistics.median(plain_s), "miss_s": statistics.median(miss_s),
            "hit_s": statistics.median(hit_s), "hit_over_plain": statistics.median(hit_s) / statistics.median(plain_s),
            "hit_over_miss": statistics.median(hit_s) / statistics.median(miss_s),
            "chunk_bytes": chunk_bytes, "state_bytes_per_chunk": state_bytes, "state_share": state_bytes / chunk_bytes,
            "chunk_parts": parts, "plain_samples": plain_s, "miss_samples": miss_s, "hit_samples": hit_s}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=6, help="even: Mamba-2 and attention layers in turn")
    p.add_argument("--prompt-chunks", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="2 repeats of 2-chunk prompts")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.prompt_chunks = 2, 2
    if engine_python() is None:
        print(skip_reason(), file=sys.stderr)
        return 2
    daemon = start_daemon("--host-mem", "4GiB", tcp=False)
    POOL.use_workdir(daemon.workdir)
    try:
        found = measure(save_model(daemon.workdir, args.hidden, args.layers), args)
    finally:
        POOL.close()
        daemon.stop()
    path = write_result("ttft-hybrid", {"family": FAMILY, "repeats": args.repeats, "hidden": args.hidden,
                                        "layers": args.layers, "prompt_tokens": args.prompt_chunks * CHUNK + 1,
                                        **found}, quick=args.quick)
    print(f"plain {found['plain_s']:.3f} s, miss {found['miss_s']:.3f} s, hit {found['hit_s']:.3f} s: "
          f"hit/plain {found['hit_over_plain']:.3f}, hit/miss {found['hit_over_miss']:.3f}; "
          f"state {found['state_bytes_per_chunk']} of {found['chunk_bytes']} bytes a chunk "
          f"({100 * found['state_share']:.1f}%)")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
