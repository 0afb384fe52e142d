"""Replay the Mooncake conversation trace through the daemon; token hit rate served from DRAM and from disk.

    python -m bench.trace_replay [--trace FILE] [--payload 4096] [--limit N]

Each trace line is one request: ``input_length`` tokens whose 512-token blocks are named by ``hash_ids`` (ids are
already chained: an id stands for its whole prefix). The host tier holds 2 % and the disk tier 40 % of the
trace's distinct blocks; a block's payload is scaled down to ``--payload`` bytes, so the tiers are sized in
chunks, not in real KV bytes. Per request, as an engine's connector would: lookup (which reports the leading
blocks in each tier and starts promoting the disk ones), get those blocks, then put the rest. Requests are
replayed back to back (timestamps ignored). Writes bench/results/trace-replay-latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import xxhash

import kvstore
from bench._common import start_daemon, write_result

BLOCK_TOKENS = 512
TRACE = "/work/shared/traces/conversation_trace.jsonl"


def block_key(block_id: int) -> bytes:
    return xxhash.xxh3_128_digest(b"trace-block:" + block_id.to_bytes(8, "little"))


def load(path: str, limit: int | None) -> list[dict]:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows[:limit] if limit else rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=TRACE)
    parser.add_argument("--payload", type=int, default=4096, help="bytes per 512-token block (scaled down)")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    args = parser.parse_args()

    rows = load(args.trace, args.limit)
    distinct = len({b for r in rows for b in r["hash_ids"]})
    host_chunks, disk_chunks = max(1, distinct * 2 // 100), distinct * 40 // 100
    from kvstore.tiers.disk.tier import DiskTier

    host_mem = max(1 << 20, host_chunks * args.payload)
    disk_size = disk_chunks * DiskTier.footprint(args.payload)
    d = start_daemon("--host-mem", str(host_mem), "--disk-size", str(disk_size), tcp=False)
    payload = os.urandom(args.payload)
    total = host_tokens = disk_tokens = 0
    full_errors = 0
    t0 = time.perf_counter()
    try:
        with kvstore.connect(d.ipc, namespace="trace", chunk_tokens=BLOCK_TOKENS, timeout=60) as c:
            for row in rows:
                keys = [block_key(b) for b in row["hash_ids"]]
                tokens = row["input_length"]
                total += tokens
                found = c.lookup_tiers(keys)
                host, disk = found.tiers.get("host", 0), found.tiers.get("disk", 0)
                hit = min(tokens, found.count * BLOCK_TOKENS)
                over = (host + disk) * BLOCK_TOKENS - hit  # the last block is partial
                host_tokens += host * BLOCK_TOKENS - (over if not disk else 0)
                disk_tokens += disk * BLOCK_TOKENS - (over if disk else 0)
                if found.count:
                    with c.get(keys[:found.count]):
                        pass
                rest = keys[found.count:]
                if rest:
                    try:
                        c.put(rest, [payload] * len(rest), parent=keys[found.count - 1] if found.count else None)
                    except kvstore.StoreFullError:
                        full_errors += 1
            stats = c.stats()
    finally:
        d.stop()
    elapsed = time.perf_counter() - t0
    result = {
        "trace": os.path.basename(args.trace), "requests": len(rows), "distinct_blocks": distinct,
        "payload_bytes": args.payload, "host_chunks": host_chunks, "disk_chunks": disk_chunks,
        "input_tokens": total, "hit_rate_host": round(host_tokens / total, 4),
        "hit_rate_disk": round(disk_tokens / total, 4), "hit_rate_total": round((host_tokens + disk_tokens) / total, 4),
        "put_full_errors": full_errors, "seconds": round(elapsed, 1),
        "counters": {k: v for k, v in stats["counters"].items() if v},
    }
    path = write_result("trace-replay", result)
    print(f"results: {path}")
    print(f"{len(rows)} requests, {distinct} distinct blocks; host {host_chunks} chunks (2 %), "
          f"disk {disk_chunks} chunks (40 %)")
    print(f"token hit rate: host {result['hit_rate_host']:.1%}, disk {result['hit_rate_disk']:.1%}, "
          f"total {result['hit_rate_total']:.1%}  ({elapsed:.0f} s, {full_errors} puts refused)")


if __name__ == "__main__":
    main()
