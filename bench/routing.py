"""Prefix-affinity routing on the Mooncake conversation trace over simulated instances, against random routing.

    python -m bench.routing [--trace FILE] [--instances 4] [--host 0.02] [--disk 0.10] [--in-flight 32]

Each instance is a simulated daemon (``kvstore.sim.replay.SimulatedStore``: the real Store over payload-less
tiers) with a host tier of ``--host`` and a disk tier of ``--disk`` times the trace's distinct blocks. Requests
are routed in trace order by:

* ``affinity``: ``kvstore.routing.Router`` — longest cached prefix (each instance's leading cached blocks,
  asked without touching its LRU), else bounded consistent hashing of the first block, load factor 1.25;
* ``hash``: the same ring and bound, never asking for prefixes;
* ``random``: a uniformly random instance (seeded).

Load for the bound is requests in flight, modelled as the last ``--in-flight`` requests routed. Reports the token
hit rate (Σ min(512 × leading cached blocks, input_length) / Σ input_length, over the whole fleet) and each
instance's share of requests, and as a reference the hit rate of one cache as large as the whole fleet's. Writes
bench/results/routing-latest.json.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections import Counter, deque

from bench._common import write_result

from kvstore.routing import Router
from kvstore.sim.replay import Capacity, SimulatedStore, block_key, hit_tokens_by_tier
from kvstore.sim.trace import distinct_blocks, read_trace
from kvstore.tiers.disk.tier import DiskTier

TRACE = "/work/shared/traces/conversation_trace.jsonl"
CHUNK = 64 << 20


def run(requests: list, names: list[str], capacity: Capacity, mode: str, in_flight: int, seed: int,
        load_factor: float = 1.25) -> dict:
    sims = {name: SimulatedStore(capacity) for name in names}
    router = Router(names, lambda keys: {n: s.cached(keys) for n, s in sims.items()}, load_factor)
    rng = random.Random(seed)
    window: deque[str] = deque()
    hits: Counter = Counter()
    chosen: Counter = Counter()
    total = 0
    started = time.perf_counter()
    for request in requests:
        keys = [block_key(b) for b in request.hash_ids]
        if mode == "random":
            name = rng.choice(names)
        else:
            if mode == "hash":
                name = router.ring.pick(keys[0] if keys else b"")
                router.ring.start(name)
            else:
                name = router.route(keys).instance
            window.append(name)
            if len(window) > in_flight:
                router.finish(window.popleft())
        chosen[name] += 1
        hits.update(hit_tokens_by_tier(sims[name].serve(keys), request.input_length))
        total += request.input_length
    return {
        "hit_rate": round(sum(hits.values()) / total, 5),
        "hit_rate_host": round(hits["host"] / total, 5), "hit_rate_disk": round(hits["disk"] / total, 5),
        "requests_share": {n: round(chosen[n] / len(requests), 4) for n in names},
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=TRACE)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--host", type=float, default=0.02, help="host tier per instance, share of distinct blocks")
    parser.add_argument("--disk", type=float, default=0.10, help="disk tier per instance, share of distinct blocks")
    parser.add_argument("--in-flight", type=int, default=32, help="requests in flight across the fleet")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    requests = read_trace(args.trace)
    blocks = distinct_blocks(requests)
    capacity = Capacity(int(blocks * args.host) * CHUNK, int(blocks * args.disk) * DiskTier.footprint(CHUNK), CHUNK)
    names = [f"engine-{i}" for i in range(args.instances)]
    pooled = Capacity(capacity.host_bytes * args.instances, capacity.disk_bytes * args.instances, CHUNK)
    single = run(requests, ["pooled"], pooled, "hash", args.in_flight, args.seed)
    results = {mode: run(requests, names, capacity, mode, args.in_flight, args.seed)
               for mode in ("affinity", "hash", "random")}
    for mode, r in results.items():
        print(f"{mode:<9} token hit rate {100 * r['hit_rate']:.2f} % (host {100 * r['hit_rate_host']:.2f} %, "
              f"disk {100 * r['hit_rate_disk']:.2f} %); shares {r['requests_share']}", flush=True)
    result = {
        "trace": os.path.basename(args.trace), "requests": len(requests), "distinct_blocks": blocks,
        "instances": args.instances, "host_share": args.host, "disk_share": args.disk,
        "in_flight": args.in_flight, "load_factor": 1.25, "seed": args.seed,
        "pooled_hit_rate": single["hit_rate"], "modes": results,
        "affinity_over_random": round(results["affinity"]["hit_rate"] / results["random"]["hit_rate"], 3),
    }
    path = write_result("routing", result)
    print(f"one cache of the fleet's total size: {100 * single['hit_rate']:.2f} %; affinity / random = "
          f"{result['affinity_over_random']}×; results: {path}")


if __name__ == "__main__":
    main()
