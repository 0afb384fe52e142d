"""Put/get throughput through the client over ipc:// and tcp://, next to memcpy; lookup latency.

    python bench/client_throughput.py [--quick] [--out FILE]

For each chunk size, a batch of 16 chunks is put (reserve → copy into the arena → commit) and read back (get →
copy each view into a destination buffer, as an engine copies into its KV cache → release). The reference is a
plain in-process memcpy of the same bytes into the same destination buffers, timed in the same round as the put
and the get so that all three see the same machine noise; ratios are medians of per-round ratios. Lookup latency is the round trip of one lookup of a
64-chunk prefix. Writes bench/results/client-throughput-<date>.json (and -latest.json) and prints a Markdown
table; ``--quick`` writes a temporary file instead (or ``--out``), never the committed results.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvstore  # noqa: E402
from _common import add_output_flag, start_daemon, write_result  # noqa: E402

SIZES = {"256KiB": 256 << 10, "2MiB": 2 << 20, "32MiB": 32 << 20}
BATCH = 16


def measure_transport(address: str, size: int, repeat: int, label: str) -> dict:
    """Interleave memcpy, put and get in every round, so that all three see the same machine noise."""
    c = kvstore.connect(address, namespace=f"bench-{label}-{size}", chunk_tokens=16, timeout=60)
    payloads = [np.random.randint(0, 255, size, dtype=np.uint8) for _ in range(BATCH)]
    dests = [np.ones(size, dtype=np.uint8) for _ in range(BATCH)]
    counter = [0]

    def memcpy_batch() -> None:
        for p, d in zip(payloads, dests):
            np.copyto(d, p)

    def get_batch(keys: list[bytes]) -> None:
        with c.get(keys) as views:
            for v, d in zip(views, dests):
                np.copyto(d, np.frombuffer(v, dtype=np.uint8))

    memcpy_t, put_t, get_t = [], [], []
    for i in range(repeat + 1):
        counter[0] += 1
        keys = c.chunk_keys([counter[0]] * 16 * BATCH)
        t0 = time.perf_counter()
        memcpy_batch()
        t1 = time.perf_counter()
        c.put(keys, payloads)
        t2 = time.perf_counter()
        get_batch(keys)
        t3 = time.perf_counter()
        assert all(np.array_equal(p, d) for p, d in zip(payloads, dests))
        c.delete(keys)
        if i:  # the first round warms up
            memcpy_t.append(t1 - t0)
            put_t.append(t2 - t1)
            get_t.append(t3 - t2)
    c.close()
    nbytes = size * BATCH
    med = statistics.median
    return {"memcpy_GBps": nbytes / med(memcpy_t) / 1e9,
            "put_GBps": nbytes / med(put_t) / 1e9, "get_GBps": nbytes / med(get_t) / 1e9,
            "put_vs_memcpy": med([m / p for m, p in zip(memcpy_t, put_t)]),
            "get_vs_memcpy": med([m / g for m, g in zip(memcpy_t, get_t)])}


def measure_lookup(address: str, calls: int) -> dict:
    c = kvstore.connect(address, namespace="bench-lookup", chunk_tokens=16)
    keys = c.chunk_keys(list(range(16 * 64)))
    c.put(keys, [b"x" * 4096] * 64)
    lat = []
    for _ in range(calls):
        t0 = time.perf_counter()
        n = c.lookup(keys)
        lat.append(time.perf_counter() - t0)
    assert n == 64
    lat.sort()
    t0 = time.perf_counter()
    for _ in range(calls):
        c.lookup(keys)
    rate = calls / (time.perf_counter() - t0)
    c.close()
    return {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6, "lookups_per_s": rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (writes a temporary file, not bench/results/)")
    add_output_flag(ap)
    args = ap.parse_args()
    repeat = 3 if args.quick else 9
    d = start_daemon("--host-mem", "1536MiB", "--disk-size", "0") if _has_disk_flag() else start_daemon("--host-mem", "1536MiB")
    rows = []
    try:
        for label, size in SIZES.items():
            row = {"chunk": label}
            for transport, address in (("ipc", d.ipc), ("tcp", d.tcp)):
                r = measure_transport(address, size, repeat, transport)
                row[f"{transport}_memcpy_GBps"] = r["memcpy_GBps"]
                for key in ("put_GBps", "get_GBps", "put_vs_memcpy", "get_vs_memcpy"):
                    row[f"{transport}_{key}"] = r[key]
            rows.append(row)
        lookup = measure_lookup(d.ipc, 500 if args.quick else 3000)
    finally:
        d.stop()
    path = write_result("client-throughput", {"batch": BATCH, "rows": rows, "lookup_64_chunks": lookup},
                        quick=args.quick, out=args.out)
    print("| chunk | memcpy GB/s | ipc put GB/s (×memcpy) | ipc get GB/s (×memcpy) | tcp put GB/s | tcp get GB/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['chunk']} | {r['ipc_memcpy_GBps']:.2f} | {r['ipc_put_GBps']:.2f} ({r['ipc_put_vs_memcpy']:.2f}×) "
              f"| {r['ipc_get_GBps']:.2f} ({r['ipc_get_vs_memcpy']:.2f}×) | {r['tcp_put_GBps']:.2f} | {r['tcp_get_GBps']:.2f} |")
    print(f"\nlookup of a 64-chunk prefix: p50 {lookup['p50_us']:.0f} µs, p99 {lookup['p99_us']:.0f} µs, "
          f"{lookup['lookups_per_s']:.0f} lookups/s\n{path}")


def _has_disk_flag() -> bool:
    from kvstore.config import SETTINGS
    return any(s.name == "disk_size" for s in SETTINGS)


if __name__ == "__main__":
    main()
