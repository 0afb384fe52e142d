"""Capacity planner on the Mooncake conversation trace: replay time, and the eviction policies compared.

    python -m bench.simulate [--trace FILE] [--repeat 3] [--plot bench/results/simulate-sweep.png]

1. Time: the full trace through ``kvstore simulate``'s replay (host 2 % + disk 10 % of the distinct blocks),
   ``--repeat`` times; the median must stay under a minute (``under_a_minute`` in the result).
2. Policies: token hit rate of each ``eviction_policy`` with a host tier alone of 2 %, 5 % and 10 % of the
   distinct blocks, and with the unbounded ceiling; ``--plot`` also draws the full sweep for every policy.

Writes bench/results/simulate-latest.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench._common import write_result

from kvstore.sim.replay import Capacity, replay, unbounded
from kvstore.sim.trace import distinct_blocks, read_trace
from kvstore.store.policies import DEFAULT_POLICY, POLICIES
from kvstore.tiers.disk.tier import DiskTier

TRACE = "/work/shared/traces/conversation_trace.jsonl"
CHUNK = 64 << 20          # 512 tokens of Llama-3-8B in bf16 (128 KiB a token)
SHARES = (0.02, 0.05, 0.10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=TRACE)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--plot", default="", help="also draw the sweep of every policy to this PNG")
    args = parser.parse_args()

    started = time.perf_counter()
    requests = read_trace(args.trace)
    read_seconds = time.perf_counter() - started
    blocks = distinct_blocks(requests)
    tiered = Capacity(blocks * 2 // 100 * CHUNK, blocks * 10 // 100 * DiskTier.footprint(CHUNK), CHUNK)
    times, tiered_result = [], None
    for _ in range(args.repeat):
        tiered_result = replay(requests, tiered)
        times.append(tiered_result.seconds)
    ceiling = unbounded(requests, CHUNK)
    table = {}
    for policy in POLICIES:
        table[policy] = {f"{round(100 * s)}%": round(replay(requests, Capacity(int(blocks * s) * CHUNK, 0, CHUNK),
                                                                  policy).hit_rate(), 5) for s in SHARES}
        print(policy, {k: f"{100 * v:.2f} %" for k, v in table[policy].items()}, flush=True)
    result = {
        "trace": os.path.basename(args.trace), "requests": len(requests), "distinct_blocks": blocks,
        "input_tokens": ceiling.input_tokens, "chunk_bytes": CHUNK, "default_policy": DEFAULT_POLICY,
        "read_seconds": round(read_seconds, 2), "replay_seconds": [round(t, 2) for t in times],
        "replay_seconds_median": round(statistics.median(times), 2),
        "under_a_minute": read_seconds + statistics.median(times) < 60,
        "tiered_host_2pct_disk_10pct": tiered_result.to_json(),
        "unbounded_hit_rate": round(ceiling.hit_rate(), 5),
        "host_only_hit_rate_by_policy": table,
    }
    if args.plot:
        from kvstore.sim.sweep import plot, sweep

        points = sweep(requests, CHUNK, list(POLICIES), blocks)
        plot(points, ceiling.hit_rate(), args.plot,
             title=f"{result['trace']}: {len(requests):,} requests, {blocks:,} distinct 512-token blocks of 64 MiB")
        result["sweep"] = [{"policy": p.policy, "fraction": p.fraction, "hit_rate": round(p.hit_rate, 5)}
                           for p in points]
    path = write_result("simulate", result)
    print(f"results: {path}")
    print(f"replay of {len(requests):,} requests: median {result['replay_seconds_median']} s "
          f"(+{read_seconds:.1f} s reading); tiered 2 % + 10 %: {100 * tiered_result.hit_rate('host'):.2f} % host "
          f"+ {100 * tiered_result.hit_rate('disk'):.2f} % disk; unbounded {100 * ceiling.hit_rate():.2f} %")


if __name__ == "__main__":
    main()
