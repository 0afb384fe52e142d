"""What metrics cost: one latency observation per request, a /metrics scrape, next to a lookup round trip.

    python -m bench.metrics_overhead [--quick]

The daemon observes every request's duration in a histogram (always, whether or not /metrics is served) and
builds the store's gauges and counters from one stats() snapshot per scrape. This measures, on the same
machine in the same run: the in-process cost of one observation; the round trip of a 16-chunk lookup through
the client (what that observation is added to); and the time of one scrape of /metrics with an empty store and
with many chunks stored (the snapshot counts committed chunks, O(chunks)). Writes
bench/results/metrics-overhead-latest.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time
import urllib.request

import kvstore
from bench._common import free_port, median_seconds, start_daemon, write_result
from prometheus_client import CollectorRegistry

from kvstore.metrics.latency import RequestLatency
from kvstore.protocol.wire import Op


def observe_ns(n: int) -> float:
    latency = RequestLatency(CollectorRegistry())

    def batch() -> None:
        for _ in range(n):
            latency.observe(Op.LOOKUP, 0.00002)

    return median_seconds(batch, 7) / n * 1e9


def scrape_ms(port: int, repeat: int) -> float:
    url = f"http://127.0.0.1:{port}/metrics"
    return median_seconds(lambda: urllib.request.urlopen(url, timeout=10).read(), repeat) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    chunks = 2000 if args.quick else 20000
    result: dict = {"observe_ns": observe_ns(20000 if args.quick else 200000)}
    port = free_port()
    d = start_daemon("--metrics-port", str(port), "--host-mem", "256MiB", tcp=False)
    try:
        with kvstore.connect(d.ipc, namespace="bench-metrics", chunk_tokens=16) as c:
            keys = c.chunk_keys(list(range(16 * 16)))
            c.put(keys, [b"x" * 4096] * len(keys))
            result["lookup_16_chunks_us"] = median_seconds(lambda: c.lookup(keys), 500 if args.quick else 3000) * 1e6
            result["scrape_ms_16_chunks"] = scrape_ms(port, 20 if args.quick else 100)
            t0 = time.perf_counter()
            for start in range(0, chunks, 512):
                batch = c.chunk_keys(list(range(start * 16, (start + 512) * 16)))
                c.put(batch, [b"y" * 1024] * len(batch))
            result["fill_s"] = time.perf_counter() - t0
            result["chunks"] = c.stats()["chunks"]
            result["scrape_ms_many_chunks"] = scrape_ms(port, 20 if args.quick else 100)
    finally:
        d.stop()
    result["observe_share_of_lookup"] = result["observe_ns"] / 1e3 / result["lookup_16_chunks_us"]
    path = write_result("metrics-overhead", result, quick=args.quick)
    print("| measure | median |\n| --- | --- |")
    print(f"| one latency observation | {result['observe_ns']:.0f} ns |")
    print(f"| lookup of 16 chunks, round trip | {result['lookup_16_chunks_us']:.0f} µs |")
    print(f"| observation / lookup | {100 * result['observe_share_of_lookup']:.2f} % |")
    print(f"| scrape, 16 chunks stored | {result['scrape_ms_16_chunks']:.2f} ms |")
    print(f"| scrape, {result['chunks']} chunks stored | {result['scrape_ms_many_chunks']:.2f} ms |")
    print(f"\n{path}")


if __name__ == "__main__":
    main()
