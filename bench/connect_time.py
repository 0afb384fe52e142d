"""Connect time against arena size, and what the first put and get into a fresh connection cost.

    python -m bench.connect_time [--quick] [--sizes 256MiB,1GiB,4GiB] [--out FILE]

For each host-tier size a daemon is started (no disk tier) and, ``--repeat`` times, a fresh client connects
over ``ipc://`` (hello + mapping the arena) and then puts and gets one batch of 16 chunks of 2 MiB into slots
it has never touched. Reported per size: the median connect time, the median of that first put and get, and
the median of a second put and get of another batch (pages already mapped), all with a memcpy of the same bytes
timed in the same round as the physical reference. A connect that maps the arena with ``MAP_POPULATE`` grows
with the arena; one that maps lazily and populates only the slots a request touches does not.
Writes bench/results/connect-time-latest.json (``--quick``: a temporary file) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import kvstore
from bench._common import add_output_flag, start_daemon, timed_put_get, write_result
from kvstore.units import format_size, parse_size

BATCH, CHUNK = 16, 2 << 20


def one_round(address: str, payloads: list[np.ndarray], dests: list[np.ndarray], round_no: int) -> dict:
    t0 = time.perf_counter()
    c = kvstore.connect(address, namespace=f"connect-{round_no}", chunk_tokens=16, timeout=60)
    connect_s = time.perf_counter() - t0
    try:
        row = {"connect_s": connect_s}
        for phase in ("first", "again"):
            keys = c.chunk_keys([round_no, len(phase)] * 8 * BATCH)
            t0 = time.perf_counter()
            for p, d in zip(payloads, dests):
                np.copyto(d, p)
            t1 = time.perf_counter()
            put_s, get_s = timed_put_get(c, keys, payloads, dests)
            row.update({f"{phase}_memcpy_s": t1 - t0, f"{phase}_put_s": put_s, f"{phase}_get_s": get_s})
        return row
    finally:
        c.close()


def measure(size: int, repeat: int) -> dict:
    d = start_daemon("--host-mem", str(size), "--disk-size", "0", tcp=False)
    payloads = [np.random.randint(0, 255, CHUNK, dtype=np.uint8) for _ in range(BATCH)]
    dests = [np.ones(CHUNK, dtype=np.uint8) for _ in range(BATCH)]
    try:
        one_round(d.ipc, payloads, dests, 0)   # warm-up: imports, the daemon's first requests
        rounds = [one_round(d.ipc, payloads, dests, i) for i in range(1, repeat + 1)]
    finally:
        d.stop()
    med = statistics.median
    nbytes = BATCH * CHUNK
    out = {"arena_bytes": size, "connect_ms": 1e3 * med(r["connect_s"] for r in rounds),
           "connect_ms_max": 1e3 * max(r["connect_s"] for r in rounds)}
    for phase in ("first", "again"):
        out[f"{phase}_put_GBps"] = nbytes / med(r[f"{phase}_put_s"] for r in rounds) / 1e9
        out[f"{phase}_get_GBps"] = nbytes / med(r[f"{phase}_get_s"] for r in rounds) / 1e9
        out[f"{phase}_memcpy_GBps"] = nbytes / med(r[f"{phase}_memcpy_s"] for r in rounds) / 1e9
        out[f"{phase}_put_vs_memcpy"] = med(r[f"{phase}_memcpy_s"] / r[f"{phase}_put_s"] for r in rounds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two sizes, 3 rounds (writes a temporary file)")
    ap.add_argument("--sizes", default="256MiB,1GiB,4GiB", help="host-tier sizes, comma-separated")
    ap.add_argument("--repeat", type=int, default=7, help="fresh connections per size (default: %(default)s)")
    add_output_flag(ap)
    args = ap.parse_args()
    sizes = [parse_size(s, "--sizes") for s in ("256MiB,1GiB" if args.quick else args.sizes).split(",")]
    rows = [measure(size, 3 if args.quick else args.repeat) for size in sizes]
    path = write_result("connect-time", {"batch": BATCH, "chunk_bytes": CHUNK, "rows": rows},
                        quick=args.quick, out=args.out)
    print("| arena | connect ms (median, max) | first put GB/s (×memcpy) | first get GB/s "
          "| again put GB/s (×memcpy) | again get GB/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {format_size(r['arena_bytes'])} | {r['connect_ms']:.1f}, {r['connect_ms_max']:.1f} "
              f"| {r['first_put_GBps']:.2f} ({r['first_put_vs_memcpy']:.2f}×) | {r['first_get_GBps']:.2f} "
              f"| {r['again_put_GBps']:.2f} ({r['again_put_vs_memcpy']:.2f}×) | {r['again_get_GBps']:.2f} |")
    print(path)


if __name__ == "__main__":
    main()
