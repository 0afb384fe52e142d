"""vLLM with and without kvstore, in the real engine: misses, hits, a multi-turn replay, the scheduler's cost.

    python -m bench.vllm_engine [--repeats 5] [--replay 200] [--quick]

Engines are the CPU build of vLLM from the engine virtualenv (``.ci/install-vllm-engine.sh``; or
``KVSTORE_VLLM_VENV``) serving the tests' random-weight float32 Llama (4 layers, 2 KV heads of 32); each pair
compared runs the same settings but for the connector, and timings are medians of interleaved repeats.

* **config**: the settings each engine resolved, and every one that differs between the pair (a connector
  could change how vLLM schedules: the comparison is only like with like if nothing else differs).
* **all misses**: batches of new prompts; token throughput with the connector ÷ without (goal ≥ 0.97). A
  second engine without the connector runs too: two identical engine processes differ by more than the
  connector could (up to 1.5x in one run on this shared 2-core machine), so its ratio to the first is the
  noise floor the connector's ratio must be read against. Each engine's first (cold) batch is kept apart.
* **all hits**: 2,000-token prompts stored beforehand, vLLM's own prefix cache emptied before each run;
  prefill throughput (a batch, one output token) and TTFT (one request at a time), with ÷ without (goal ≥ 3).
* **replay**: the first ``--replay`` requests of the multi-turn conversation trace, scaled down (a 512-token
  trace block becomes 32 tokens, at most 32 blocks; 8 output tokens), 8 at a time in arrival order, with vLLM's
  prefix caching on and a KV cache of 16k tokens, below the replay's working set: vLLM alone vs vLLM +
  kvstore, token throughput and TTFT p50/p99.
* **scheduler**: the connector's time in one scheduling pass over 256 waiting 2,000-token requests (vLLM's
  scheduler records, the real connector and daemon; vLLM 0.33 interface in this python): the first pass
  (which looks them all up, 64 a round trip) and every later one (answered from the lookups it kept), against
  asking the daemon once per request and pass.

Writes bench/results/vllm-engine-latest.json.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from typing import Any

from bench._common import start_daemon, write_result
from harness.engines.vllm_real import POOL, VOCAB, engine_python, prompts, skip_reason

TRACE = "/work/shared/traces/conversation_trace.jsonl"
ENGINE = dict(max_num_batched_tokens=4096, num_blocks=1024, max_model_len=4096)


def timed(engine: Any, batch: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """One batch: wall seconds until every request finished, tokens in and out, each request's TTFT."""
    reply = engine.call("generate", prompts=batch, max_tokens=max_tokens)
    outs = reply["outputs"]
    return {"wall": reply["wall"], "tokens": sum(len(p) for p in batch) + sum(len(o["tokens"]) for o in outs),
            "ttft": [o["ttft"] for o in outs]}


def config_lines(engine: Any) -> dict[str, str]:
    """The engine's resolved settings, from its start-up log line."""
    with open(engine.log_path, errors="replace") as f:
        text = f.read()
    found = re.search(r"with config: (.*)", text)
    fields: dict[str, str] = {}
    if found:
        for item in re.split(r", (?=[a-z_]+=)", found.group(1)):
            key, _, value = item.partition("=")
            fields[key] = value
    blocks = re.search(r"(# CPU blocks: \d+|KV cache size: [^\n]*|Maximum concurrency[^\n]*)", text)
    fields["kv_cache"] = blocks.group(1) if blocks else ""
    return fields


def config_difference(off: Any, on: Any) -> dict[str, Any]:
    a, b = config_lines(off), config_lines(on)
    differ = {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    return {"differ": differ, "fields_compared": len(set(a) | set(b))}


def all_misses(engines: dict[str, Any], repeats: int, n: int, length: int) -> dict[str, Any]:
    """`engines`: "off" and "off2" (the same settings, no connector: the noise floor) and "on"."""
    cold = {name: timed(e, prompts(n, length, seed=900 + i), 8)["wall"] for i, (name, e) in enumerate(engines.items())}
    runs: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]  # each engine first in turn
        for k, name in enumerate(order):
            result = timed(engines[name], prompts(n, length, seed=1000 + len(names) * r + k), 8)
            runs[name].append(result["tokens"] / result["wall"])
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"prompts": n, "prompt_tokens": length, "tokens_per_s": runs, "median_tokens_per_s": med,
            "ratio": med["on"] / med["off"], "noise_floor_ratio": med["off2"] / med["off"],
            "ratio_vs_both_plain": med["on"] / statistics.mean([med["off"], med["off2"]]), "cold_wall_s": cold}


def all_hits(off: Any, on: Any, repeats: int, n: int, length: int) -> dict[str, Any]:
    batch = prompts(n, length, seed=2000)
    on.generate(batch, 1)           # stored (generate returns once the saves are done)
    prefill: dict[str, list[float]] = {"off": [], "on": []}
    ttft: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(repeats):
        for name, engine in ([("off", off), ("on", on)] if r % 2 == 0 else [("on", on), ("off", off)]):
            engine.reset_prefix_cache()
            result = timed(engine, batch, 1)
            prefill[name].append(n * length / result["wall"])
            for p in batch[:4]:
                engine.reset_prefix_cache()
                ttft[name].append(timed(engine, [p], 1)["ttft"][0])
    med_prefill = {k: statistics.median(v) for k, v in prefill.items()}
    med_ttft = {k: statistics.median(v) for k, v in ttft.items()}
    return {"prompts": n, "prompt_tokens": length, "prefill_tokens_per_s": prefill, "ttft_s": ttft,
            "median_prefill_tokens_per_s": med_prefill, "median_ttft_s": med_ttft,
            "prefill_ratio": med_prefill["on"] / med_prefill["off"],
            "ttft_ratio": med_ttft["off"] / med_ttft["on"]}


def trace_prompts(limit: int, block: int = 32, max_blocks: int = 32) -> list[list[int]]:
    """The trace's first requests as token ids: one pseudo-random run of `block` tokens per (chained) block id."""
    rows = []
    with open(TRACE) as f:
        for line in f:
            if len(rows) == limit:
                break
            rows.append(json.loads(line))
    out = []
    for row in rows:
        ids = row["hash_ids"][:max_blocks]
        tokens: list[int] = []
        for h in ids:
            rng = random.Random(h)
            tokens += [rng.randrange(3, VOCAB) for _ in range(block)]
        length = min(len(tokens), max(block, row["input_length"] * block // 512))
        out.append(tokens[:length])
    return out


def replay(daemon: Any, limit: int) -> dict[str, Any]:
    """vLLM alone ("off", and "off2": the same again, the noise floor) and vLLM + kvstore ("on")."""
    requests = trace_prompts(limit)
    small = dict(max_num_batched_tokens=4096, num_blocks=128, max_model_len=4096)  # 16k tokens of KV
    engines = {"off": POOL.get("replay-off", **small), "off2": POOL.get("replay-off2", **small),
               "on": POOL.get("replay-on", connector=POOL.connector(chunk_tokens=128), **small)}
    with daemon_client(daemon) as c:
        c.clear()
    walls = {name: 0.0 for name in engines}
    tokens = {name: 0 for name in engines}
    ttft: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for g, i in enumerate(range(0, len(requests), 8)):
        group = requests[i:i + 8]
        for name in names[g % 3:] + names[:g % 3]:
            result = timed(engines[name], group, 8)
            walls[name] += result["wall"]
            tokens[name] += result["tokens"]
            ttft[name] += result["ttft"]
    out: dict[str, Any] = {"requests": len(requests), "prompt_tokens": sum(len(p) for p in requests),
                           "kv_cache_tokens": 128 * 128, "connector": engines["on"].stats()}
    for name in engines:
        q = statistics.quantiles(ttft[name], n=100)
        out[name] = {"tokens_per_s": tokens[name] / walls[name], "ttft_p50_s": statistics.median(ttft[name]),
                     "ttft_p99_s": q[98], "wall_s": walls[name]}
    out["throughput_ratio"] = out["on"]["tokens_per_s"] / out["off"]["tokens_per_s"]
    out["noise_floor_ratio"] = out["off2"]["tokens_per_s"] / out["off"]["tokens_per_s"]
    return out


def daemon_client(daemon: Any, namespace: str | None = None, key_scheme: str | None = None) -> Any:
    """A client of `daemon`; in `namespace` (an engine's session namespace) and `key_scheme` (its keys') to reach
    the chunks it stores."""
    import kvstore

    chosen: dict[str, Any] = {} if namespace is None else {"namespace": namespace}
    if key_scheme is not None:
        chosen["key_scheme"] = key_scheme
    return kvstore.connect(daemon.ipc, timeout=10.0, **chosen)


def scheduler_cost(daemon: Any, waiting: int = 256, length: int = 2000) -> dict[str, Any]:
    """The connector's share of a scheduling pass over `waiting` requests (the vLLM interface wheel)."""
    from harness.engines.vllm_env import Engine, request

    engine = Engine(daemon.ipc, layers=4, kv_heads=2, head_dim=32, chunk_tokens=256)
    reqs = [request(f"w{i}", p) for i, p in enumerate(prompts(waiting, length, seed=3000))]
    side = engine.scheduler.scheduler_side
    store = side.stores[0]
    with daemon_client(daemon, side.session_namespace, side.key_scheme) as c:  # half of them stored
        for r in reqs[::2]:
            keys = side.plain_keys(store, list(r.prompt_token_ids)[: (length - 1) // 256 * 256])
            c.put(keys, [bytes(store.geometry.chunk_nbytes)] * len(keys))
    for r in reqs:
        engine.scheduler.on_new_request(r)

    def one_pass() -> float:
        t0 = time.perf_counter()
        for r in reqs:
            engine.scheduler.get_num_new_matched_tokens(r, 0)
        return time.perf_counter() - t0

    first = one_pass()
    later = statistics.median(one_pass() for _ in range(5))

    def ask_each() -> float:  # what a connector that asks every time pays per pass
        t0 = time.perf_counter()
        for r in reqs:
            store.lookup(side.plain_keys(store, list(r.prompt_token_ids)[: (length - 1) // 256 * 256]))
        return time.perf_counter() - t0

    each = statistics.median(ask_each() for _ in range(3))
    engine.scheduler.shutdown()
    engine.worker.shutdown()
    return {"waiting": waiting, "prompt_tokens": length, "first_pass_ms": first * 1e3, "later_pass_ms": later * 1e3,
            "ask_every_request_ms": each * 1e3, "lookup_calls": engine.scheduler.stats.get("lookup_calls", 0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--replay", type=int, default=200, help="trace requests to replay (0: skip)")
    parser.add_argument("--quick", action="store_true", help="fewer and smaller batches")
    parser.add_argument("--parts", default="scheduler,misses,hits,replay", help="which measurements to run")
    args = parser.parse_args()
    if engine_python() is None:
        print(skip_reason(), file=sys.stderr)
        return 2
    daemon = start_daemon("--host-mem", "2GiB", "--log-level", "warning", tcp=False)
    POOL.use_workdir(daemon.workdir)
    result: dict[str, Any] = {"engine": {"model": "random-weight Llama, 4 layers, 2 KV heads x 32, float32",
                                         **ENGINE, "chunk_tokens": 256}}
    n_miss, n_hit = (4, 4) if args.quick else (8, 8)
    parts = set(args.parts.split(","))
    try:
        if "scheduler" in parts:
            result["scheduler"] = scheduler_cost(daemon)
            print(json.dumps({"scheduler": result["scheduler"]}), flush=True)
        if parts & {"misses", "hits"}:
            off = POOL.get("off", **ENGINE)
            on = POOL.get("on", connector=POOL.connector(), **ENGINE)
            result["config"] = config_difference(off, on)
        if "misses" in parts:
            result["all_misses"] = all_misses({"off": off, "off2": POOL.get("off2", **ENGINE), "on": on},
                                              args.repeats, n_miss, 1800)
            POOL.keep("off", "on")
            print(json.dumps({k: result["all_misses"][k] for k in ("ratio", "noise_floor_ratio")}), flush=True)
        if "hits" in parts:
            result["all_hits"] = all_hits(off, on, args.repeats, n_hit, 2000)
            print(json.dumps({k: result["all_hits"][k] for k in ("prefill_ratio", "ttft_ratio")}), flush=True)
        POOL.keep()
        if args.replay and "replay" in parts:
            result["replay"] = replay(daemon, args.replay)
            print(json.dumps({k: result["replay"][k] for k in ("throughput_ratio", "noise_floor_ratio")}), flush=True)
    finally:
        POOL.close()
        daemon.stop()
    full = parts >= {"scheduler", "misses", "hits", "replay"}
    name = "vllm-engine" if full else "vllm-engine-" + "-".join(sorted(parts))
    path = write_result(name, result, quick=args.quick)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
