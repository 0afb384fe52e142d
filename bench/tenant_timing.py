"""A lookup of another tenant's chunk costs what a miss costs: both latency distributions, side by side.

    python -m bench.tenant_timing [--lookups 2000] [--chain 8] [--quick] [--out FILE]

A daemon with a tenants table: tenant ``theirs`` owns ``theirs:`` and lists a uid that is not ours. Its chunks are
put while the namespace is still open, then the table is reloaded to restrict it (``kvstore reload``'s request).
A client of an open namespace then asks the daemon (over the socket, no shared index) to look up, interleaved,
``--lookups`` times each: a chain of ``theirs``' stored chunks (forbidden: answered as a miss) and a chain of keys
nobody stored (a miss). Reported: p10/p50/p90/p99 of each in microseconds, the ratio of the medians, and whether
the two distributions overlap (each median inside the other's p10–p90).
Writes bench/results/tenant-timing-latest.json (``--quick``: a temporary file) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import kvstore
from bench._common import BenchDaemon, add_output_flag, short_tempdir, start_daemon, write_result

OPEN = '[tenants.theirs]\nnamespaces = ["theirs:"]\n'
RESTRICTED = OPEN + f"uids = [{os.getuid() + 54321}]\n"


def percentiles(samples: list[float]) -> dict[str, float]:
    """p10, p50, p90 and p99 of ``samples`` (seconds) in microseconds."""
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return {f"p{p}": round(cuts[p - 1] * 1e6, 2) for p in (10, 50, 90, 99)}


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    """Whether each distribution's median lies inside the other's p10–p90 (``percentiles`` of each)."""
    return a["p10"] <= b["p50"] <= a["p90"] and b["p10"] <= a["p50"] <= b["p90"]


def interleaved(client: kvstore.Client, forbidden: list[bytes], lookups: int, chain: int) -> tuple[list, list]:
    """``lookups`` timings each of a forbidden chain and of a fresh missing chain, alternating which goes first."""
    hidden, missed = [], []
    for i in range(lookups):
        absent = [os.urandom(16) for _ in range(chain)]
        for which in ((0, 1) if i % 2 else (1, 0)):
            keys = forbidden if which == 0 else absent
            t0 = time.perf_counter()
            found = client.lookup(keys)
            (hidden if which == 0 else missed).append(time.perf_counter() - t0)
            assert found == 0, "a forbidden or absent chain was found"
    return hidden, missed


def lookup_args(description: str) -> argparse.Namespace:
    """The arguments of the lookup-timing benchmarks: ``--lookups``, ``--chain``, ``--quick``, ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--lookups", type=int, default=2000, help="lookups of each kind (default 2000)")
    parser.add_argument("--chain", type=int, default=8, help="keys per lookup (default 8)")
    parser.add_argument("--quick", action="store_true", help="300 lookups each, result to a temporary file")
    add_output_flag(parser)
    args = parser.parse_args()
    args.lookups = 300 if args.quick else args.lookups
    return args


def tenants_daemon(table: str, prefix: str) -> tuple[BenchDaemon, str]:
    """A DRAM-only daemon of 64 MiB started with a config file holding ``table``; the daemon and the file."""
    config = os.path.join(short_tempdir(prefix), "kvstore.toml")
    with open(config, "w") as f:
        f.write(table)
    return start_daemon("--config", config, "--host-mem", "64MiB", "--disk-size", "0", tcp=False), config


def main() -> None:
    args = lookup_args(__doc__.splitlines()[0])
    lookups = args.lookups
    daemon, config = tenants_daemon(OPEN, "tt-")
    try:
        keys = [os.urandom(16) for _ in range(args.chain)]
        with kvstore.connect(daemon.ipc, namespace="theirs:a", timeout=30) as theirs:
            theirs.put(keys, [b"t" * 4096] * args.chain)
        with open(config, "w") as f:
            f.write(RESTRICTED)
        with kvstore.connect(daemon.ipc, namespace="mine", timeout=30, use_arena=False) as mine:
            assert mine.reload()["applied"]
            interleaved(mine, keys, 50, args.chain)   # warm-up
            hidden, missed = interleaved(mine, keys, lookups, args.chain)
    finally:
        daemon.stop()
    forbidden_us, miss_us = percentiles(hidden), percentiles(missed)
    result = {"lookups": lookups, "chain": args.chain, "forbidden_us": forbidden_us, "miss_us": miss_us,
              "median_ratio": round(statistics.median(hidden) / statistics.median(missed), 3),
              "overlap": overlap(forbidden_us, miss_us)}
    path = write_result("tenant-timing", result, quick=args.quick, out=args.out)
    print("| lookup | p10 µs | p50 µs | p90 µs | p99 µs |\n|---|---|---|---|---|")
    for name in ("forbidden", "miss"):
        row = result[f"{name}_us"]
        print(f"| {name} | {row['p10']} | {row['p50']} | {row['p90']} | {row['p99']} |")
    print(f"median ratio forbidden/miss: {result['median_ratio']}, overlap: {result['overlap']}  ({path})")


if __name__ == "__main__":
    main()
