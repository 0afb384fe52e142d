"""Time to first token with a host-tier hit ÷ plain prefill on each hybrid family, and the state's share of a chunk.

    python -m bench.ttft_hybrid [--families a,b,...] [--repeats 5] [--hidden 256] [--layers 4]
                                [--prompt-tokens 2048] [--quick]

Every hybrid family vLLM's CPU build serves, each a small model of its shape with random weights
(``harness/engines/scripts/vllm_engine.py``, `save-model`): ``hybrid-mamba2`` (Granite 4: Mamba-2 and attention
layers in turn), ``hybrid-falcon-h1`` (attention and Mamba-2 side by side in every layer), ``hybrid-nemotron-h``
(Mamba-2, attention and MLP blocks, one a layer: the first ``--layers`` of mamba, attention, mlp, mamba),
``hybrid-zamba2`` (Mamba-2 layers and a shared attention block), ``hybrid-lfm2`` (gated short convolutions and
attention layers in turn), all float32, and ``hybrid-gdn`` (Qwen3-Next: Gated DeltaNet and attention layers in turn)
in bfloat16, the only dtype vLLM's CPU Gated DeltaNet kernels take. Per family, two CPU vLLM engines (the engine
virtualenv, ``KVSTORE_VLLM_VENV``), both pinned to one reserved core (``VLLM_CPU_NUM_OF_RESERVED_CPU=1``):

* plain: no connector, no prefix caching, the whole prompt prefilled in one step;
* kvstore: the connector with vLLM's prefix caching in align mode (a state only exists there), a token budget
  of one hybrid block a step and one request at a time (what vLLM's CPU Mamba scan needs in align mode).

The hybrid block is the engine's: vLLM sizes it so that an attention page holds a state page, so it differs
between families. The plain engine reports it (``block_size``); the kvstore engine gets it as the connector's
`chunk_tokens` and as its token budget, and must report the same block.

Per repeat, a fresh prompt of as many whole blocks as fit in ``--prompt-tokens`` (at least one), plus one token,
runs on the plain engine (plain prefill), then on the kvstore engine (a miss: prefilled block by block, its chunks
and states saved to the daemon's DRAM), and again on the kvstore engine after vLLM forgot its own cache (a hit:
every chunk's attention KV and the last chunk's state loaded, one token computed). TTFT is the engine's time to
the first token of a one-token request. The hit must give the reference's first token: plain prefill's (and so
must the miss), or the miss's, what the saving engine computed, where plain prefill is no reference on this build
(each family's ``reference`` and ``reference_why`` in the JSON): LFM2 prefilled block by block is not plain
prefill even without the connector (``ENGINE_REFERENCE``), and Gated DeltaNet's plain prefill in one step is
another bfloat16 computation than its prefill block by block (``plain_token_agrees``: the share of prompts whose
plain first token is the miss's all the same). ``hit_logprob_delta`` is the largest difference of the hit's
first-token log-probability from the reference's. Medians; the first repeat warms up. The state's share
of the bytes stored per chunk is the engine's own chunk layout (``chunk_parts``).

Writes bench/results/ttft-hybrid-latest.json: the settings, and per family under ``families`` its block, prompt,
medians, ratios and chunk layout (or the ``error`` that stopped it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from bench._common import parse_names, start_daemon, write_result
from harness.engines.vllm_hybrid import ENGINE_REFERENCE, PINNED
from harness.engines.vllm_real import POOL, EngineError, engine_python, prompts, skip_reason

FAMILIES = ("hybrid-mamba2", "hybrid-falcon-h1", "hybrid-nemotron-h", "hybrid-zamba2", "hybrid-lfm2", "hybrid-gdn")
DTYPE = {"hybrid-gdn": "bfloat16"}   # vLLM's CPU Gated DeltaNet kernels take bfloat16 only; the rest float32
BF16_WHY = ("bfloat16: plain prefill in one step is another bfloat16 computation than prefill one block a step, so "
            "the hit is held to the miss's token (the same last step on the same kernels over loaded KV and state)")
LFM2_WHY = ("prefilled one block a step (as align mode must), this family is not plain prefill on vLLM's CPU build "
            "even without the connector, so the hit is held to the miss's token (ENGINE_REFERENCE)")


def reference(family: str) -> tuple[str, str | None]:
    """What a hit's first token is held to: ``plain`` prefill, or the ``miss`` (with the reason)."""
    if family in ENGINE_REFERENCE:
        return "miss", LFM2_WHY
    if DTYPE.get(family, "float32") != "float32":
        return "miss", BF16_WHY
    return "plain", None


def engines(family: str, args: argparse.Namespace) -> tuple[Any, Any, int]:
    """The family's plain and kvstore engines, and its hybrid block as the engines report it."""
    # num_blocks 0: vLLM sizes each cache from VLLM_CPU_KVCACHE_SPACE, room for the model length in every group
    # whatever the family's block and groups
    common = {"family": family, "size": (args.hidden, args.layers), "dtype": DTYPE.get(family, "float32"),
              "env": PINNED, "max_model_len": 8192, "num_blocks": 0}
    plain = POOL.get(f"bench-{family}-plain", prefix_caching=False, **common)
    block = plain.block_size()
    store = POOL.get(f"bench-{family}-kvstore", connector=POOL.connector(chunk_tokens=block),
                     max_num_batched_tokens=block, max_num_seqs=1, **common)
    assert store.block_size() == block, f"{family}: the kvstore engine's block {store.block_size()}, not {block}"
    return plain, store, block


def measure(family: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    plain, store, block = engines(family, args)
    parts = store.chunk_parts()
    assert any(p["kind"] == "state" for p in parts), f"{family}: the connector stores no state ({parts})"
    chunks = max(1, args.prompt_tokens // block)
    against, why = reference(family)
    plain_s, miss_s, hit_s, drift, agree = [], [], [], [], 0
    for prompt in prompts(args.repeats + 1, chunks * block + 1, seed=seed):
        want = plain.generate([prompt], 1)[0]
        miss = store.generate([prompt], 1)[0]
        store.reset_prefix_cache()
        before = store.stats().get("worker", {}).get("chunks_loaded", 0)
        hit = store.generate([prompt], 1)[0]
        loaded = store.stats().get("worker", {}).get("chunks_loaded", 0) - before
        assert loaded == chunks, f"{family}: the hit loaded {loaded} chunks, not {chunks}"
        ref = want if against == "plain" else miss
        assert hit["tokens"] == ref["tokens"] == miss["tokens"], f"{family}: a hit gave another first token"
        store.reset_prefix_cache()
        plain_s.append(want["ttft"])
        miss_s.append(miss["ttft"])
        hit_s.append(hit["ttft"])
        drift.append(abs(hit["logprobs"][0] - ref["logprobs"][0]))
        agree += want["tokens"] == miss["tokens"]
    POOL.keep()
    plain_s, miss_s, hit_s = plain_s[1:], miss_s[1:], hit_s[1:]
    chunk_bytes = sum(p["nbytes"] for p in parts)
    state_bytes = sum(p["nbytes"] for p in parts if p["kind"] == "state")
    plain_m, miss_m, hit_m = (statistics.median(x) for x in (plain_s, miss_s, hit_s))
    return {"dtype": DTYPE.get(family, "float32"), "block_tokens": block, "chunks": chunks,
            "prompt_tokens": chunks * block + 1, "reference": against,
            **({"reference_why": why, "plain_token_agrees": agree / (args.repeats + 1)} if why else {}),
            "hit_logprob_delta": max(drift), "plain_s": plain_m, "miss_s": miss_m, "hit_s": hit_m,
            "hit_over_plain": hit_m / plain_m, "hit_over_miss": hit_m / miss_m, "chunk_bytes": chunk_bytes,
            "state_bytes_per_chunk": state_bytes, "state_share": state_bytes / chunk_bytes, "chunk_parts": parts,
            "plain_samples": plain_s, "miss_samples": miss_s, "hit_samples": hit_s,
            "wall_s": time.perf_counter() - started}


def report(results: dict[str, dict[str, Any]]) -> None:
    print(f"{'family':18} {'block':>5} {'prompt':>6} {'plain s':>8} {'miss s':>8} {'hit s':>7} {'hit/plain':>9} "
          f"{'hit/miss':>8} {'state':>6}  reference")
    for family, r in results.items():
        if "error" in r:
            print(f"{family:18} failed: {r['error'].splitlines()[0]}")
            continue
        print(f"{family:18} {r['block_tokens']:5d} {r['prompt_tokens']:6d} {r['plain_s']:8.3f} {r['miss_s']:8.3f} "
              f"{r['hit_s']:7.3f} {r['hit_over_plain']:9.3f} {r['hit_over_miss']:8.3f} "
              f"{100 * r['state_share']:5.1f}%  {r['reference']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {','.join(FAMILIES)}")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4, help="even: recurrent and attention layers in turn")
    p.add_argument("--prompt-tokens", type=int, default=2048,
                   help="each prompt is the whole hybrid blocks in this many tokens (at least one), plus one token")
    p.add_argument("--quick", action="store_true", help="2 repeats of 512-token prompts")
    args = p.parse_args()
    families = parse_names(args.families, "--families", FAMILIES)
    if args.quick:
        args.repeats, args.prompt_tokens = 2, 512
    if engine_python() is None:
        print(skip_reason(), file=sys.stderr)
        return 2
    daemon = start_daemon("--host-mem", "4GiB", tcp=False)
    POOL.use_workdir(daemon.workdir)
    results: dict[str, dict[str, Any]] = {}
    try:
        for family in families:
            try:
                results[family] = measure(family, args, seed=7 + FAMILIES.index(family))
            except (AssertionError, EngineError) as exc:   # the other families still run
                results[family] = {"error": f"{type(exc).__name__}: {exc}"}
                POOL.keep()
            print(family, {k: v for k, v in results[family].items() if not k.endswith(("samples", "parts"))},
                  flush=True)
    finally:
        POOL.close()
        daemon.stop()
    path = write_result("ttft-hybrid", {"repeats": args.repeats, "hidden": args.hidden, "layers": args.layers,
                                        "prompt_tokens_at_most": args.prompt_tokens + 1, "families": results},
                        quick=args.quick)
    report(results)
    print(path)
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
