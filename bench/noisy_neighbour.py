"""Noisy neighbour: tenant A replays the conversation trace while tenant B floods DRAM with one-shot prompts.

    python -m bench.noisy_neighbour [--trace FILE] [--limit 4000] [--flood 3] [--host-share 0.3] [--guarantee 0.9]
                                    [--quick]

The replay is ``kvstore simulate``'s (the daemon's own Store, eviction and tenant budgets over payload-less tiers).
DRAM holds ``--host-share`` of A's distinct blocks; for every request of A, B sends ``--flood`` prompts of blocks
never seen before (each as long as A's request). A's token hit rate is measured three ways: alone (B silent),
shared with no tenants table (B's flood evicts A's chunks), and with A guaranteed ``--guarantee`` of DRAM. The
target: guaranteed ≥ 0.95 × alone, and without a guarantee a visible fall. The replay is deterministic, so one
run of each is the figure (no repeats to take a median of). Writes bench/results/noisy-neighbour-latest.json
(``--quick``: 1,000 requests, to a temporary file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from bench._common import write_result

from kvstore.sim.replay import Capacity, replay
from kvstore.sim.trace import Request, distinct_blocks, read_trace
from kvstore.tenants import parse_tenants

TRACE = "/work/shared/traces/conversation_trace.jsonl"
CHUNK = 64 << 20   # 512 tokens of Llama-3-8B in bf16
SLOT = CHUNK        # a multiple of the arena's 4 KiB pages


def with_flood(requests: list[Request], flood: int) -> list[Request]:
    """A's requests (tenant a), each followed by ``flood`` one-shot prompts of tenant b."""
    mixed: list[Request] = []
    fresh = -1
    for r in requests:
        mixed.append(Request(r.timestamp, r.input_length, r.output_length, r.hash_ids, "a"))
        for _ in range(flood):
            ids = tuple(range(fresh, fresh - len(r.hash_ids), -1))
            fresh -= len(r.hash_ids)
            mixed.append(Request(r.timestamp, r.input_length, r.output_length, ids, "b"))
    return mixed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=TRACE)
    parser.add_argument("--limit", type=int, default=4000, help="requests of A replayed")
    parser.add_argument("--flood", type=int, default=3, help="one-shot prompts of B per request of A")
    parser.add_argument("--host-share", type=float, default=0.3, help="DRAM, as a share of A's distinct blocks")
    parser.add_argument("--guarantee", type=float, default=0.9, help="A's guaranteed DRAM, as a share of DRAM")
    parser.add_argument("--quick", action="store_true", help="1,000 requests of A, written to a temporary file")
    parser.add_argument("--out", default=None, help="write the result here instead")
    args = parser.parse_args()
    a = read_trace(args.trace, 1000 if args.quick else args.limit)
    blocks = distinct_blocks(a)
    host = max(1, int(blocks * args.host_share)) * SLOT
    capacity = Capacity(host, 0, CHUNK)
    guaranteed = int(host * args.guarantee) // SLOT * SLOT
    table = parse_tenants({"a": {"namespaces": ["a:"], "dram": {"guaranteed": guaranteed}},
                           "b": {"namespaces": ["b:"]}}, "noisy_neighbour")
    mixed = with_flood(a, args.flood)
    started = time.perf_counter()
    alone = replay([Request(r.timestamp, r.input_length, r.output_length, r.hash_ids, "a") for r in a], capacity,
                   tenants=table)
    shared = replay(mixed, capacity)
    kept = replay(mixed, capacity, tenants=table)
    rate = {name: r.tenants["a"]["hit_tokens"] / r.tenants["a"]["input_tokens"]
            for name, r in (("alone", alone), ("no_guarantee", shared), ("guaranteed", kept))}
    payload = {
        "command": " ".join(["python -m bench.noisy_neighbour", *sys.argv[1:]]),
        "load": os.getloadavg(), "trace": os.path.basename(args.trace), "requests_a": len(a),
        "flood_per_request": args.flood, "distinct_blocks_a": blocks, "host_bytes": host, "chunk_bytes": CHUNK,
        "host_chunks": host // SLOT, "a_guaranteed_bytes": guaranteed,
        "a_token_hit_rate": {k: round(v, 5) for k, v in rate.items()},
        "guaranteed_over_alone": round(rate["guaranteed"] / rate["alone"], 4) if rate["alone"] else None,
        "no_guarantee_over_alone": round(rate["no_guarantee"] / rate["alone"], 4) if rate["alone"] else None,
        "target_met": bool(rate["alone"]) and rate["guaranteed"] >= 0.95 * rate["alone"],
        "b_evictions_of_a": kept.tenants["a"].get("evicted_by_others", 0),
        "b_token_hit_rate_guaranteed": kept.to_json()["tenants"]["b"]["hit_rate"],
        "replay_seconds": {"alone": round(alone.seconds, 1), "no_guarantee": round(shared.seconds, 1),
                           "guaranteed": round(kept.seconds, 1)},
        "seconds": round(time.perf_counter() - started, 1),
        "note": "simulated replay through the daemon's Store (no payloads), deterministic: one run of each; "
                "shared 2-core host",
    }
    path = write_result("noisy-neighbour", payload, quick=args.quick, out=args.out)
    print(json.dumps(payload["a_token_hit_rate"]), "guaranteed/alone", payload["guaranteed_over_alone"],
          "no_guarantee/alone", payload["no_guarantee_over_alone"], "->", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
