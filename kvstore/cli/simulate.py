"""``kvstore simulate``: capacity planning — replay a request trace through the daemon's Store at given tier sizes.

Prints the token hit rate each tier would serve, next to the hit rate with unbounded capacity, so that an
operator sees how far the sizes are from the ceiling; ``--sweep`` also draws hit rate against capacity as a PNG
and ``--json`` prints the figures as one JSON object. See ``kvstore/sim/replay.py`` for what is simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..errors import ConfigError
from ..units import format_size, parse_size
from .flag_types import positive_count

DEFAULT_PLOT = "hit-rate-sweep.png"


def register(sub: argparse._SubParsersAction) -> None:
    from ..store.policies import DEFAULT_POLICY, POLICIES

    p = sub.add_parser("simulate", help="replay a request trace at given tier sizes and report token hit rates",
                       description="Capacity planning: replay a request trace through the daemon's store at the "
                                   "given tier sizes and print the token hit rate of each tier next to the "
                                   "unbounded ceiling; --sweep also plots hit rate against capacity "
                                   "(needs matplotlib: pip install 'kvstore[sim]').")
    p.add_argument("trace", metavar="TRACE", help="JSON lines in Mooncake's format (timestamp, input_length, "
                                                  "output_length, hash_ids)")
    p.add_argument("--host-mem", required=True, metavar="SIZE", help="host DRAM tier size (e.g. 64GiB)")
    p.add_argument("--disk-size", default="0", metavar="SIZE", help="disk tier size (default: 0, no disk tier)")
    p.add_argument("--gpu-mem", default="0", metavar="SIZE", help="GPU HBM tier size (default: 0)")
    p.add_argument("--chunk-bytes", required=True, metavar="SIZE",
                   help="KV bytes of one trace block (e.g. 64MiB: 512 tokens of Llama-3-8B in bf16)")
    p.add_argument("--block-tokens", type=positive_count, default=512, metavar="N",
                   help="tokens per trace block (default: %(default)s, as in Mooncake's traces)")
    p.add_argument("--policy", default=DEFAULT_POLICY, choices=[*POLICIES, "all"],
                   help="eviction policy (default: %(default)s); all: one row (and curve) per policy")
    p.add_argument("--limit", type=positive_count, default=None, metavar="N", help="replay the first N requests")
    p.add_argument("--tenants", default=None, metavar="TOML",
                   help="a config file whose [tenants.NAME] tables give budgets; the trace's tenant field names "
                        "each request's tenant, and each tenant's hit rate is reported")
    p.add_argument("--restart-every", type=positive_count, default=None, metavar="N",
                   help="also replay a rolling upgrade: every N requests the next daemon of the fleet restarts, "
                        "once with and once without warm restart, and report the hit rate it costs")
    p.add_argument("--fleet", type=positive_count, default=1, metavar="N",
                   help="--restart-every: daemons in the fleet, requests routed by prefix (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--sweep", action="store_true", help="also replay at 0.5 %%..100 %% of the distinct blocks "
                                                        "and draw hit rate against capacity")
    p.add_argument("--out", default=None, metavar="PNG", help=f"--sweep: the plot (default: {DEFAULT_PLOT})")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..sim.replay import replay, unbounded
    from ..sim.trace import distinct_blocks, read_trace
    from ..store.policies import POLICIES

    capacity = _capacity(args)
    if args.out is not None and not args.sweep:
        raise ConfigError("--out names the --sweep plot; add --sweep, or drop --out")
    if args.sweep:
        args.out = args.out or DEFAULT_PLOT
        _check_sweep_output(args.out)   # before the replays, not after them
    if args.restart_every is None and args.fleet != 1:
        raise ConfigError("--fleet sizes the fleet of --restart-every; add --restart-every, or drop --fleet")
    if args.restart_every is not None and args.tenants is not None:
        raise ConfigError("--restart-every: restarts are not modelled with --tenants; drop one of them")
    requests = read_trace(args.trace, args.limit, args.block_tokens)
    blocks = distinct_blocks(requests)
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    tenants = _tenants(args, capacity)
    results = [replay(requests, capacity, p, args.block_tokens, tenants) for p in policies]
    ceiling = unbounded(requests, capacity.chunk_bytes, args.block_tokens)
    report: dict[str, Any] = {
        "trace": args.trace, "requests": len(requests), "input_tokens": ceiling.input_tokens,
        "distinct_blocks": blocks, "chunk_bytes": capacity.chunk_bytes,
        "gpu_bytes": capacity.gpu_bytes, "host_bytes": capacity.host_bytes, "disk_bytes": capacity.disk_bytes,
        "gpu_chunks": capacity.gpu_bytes // _slot(capacity.chunk_bytes),
        "host_chunks": capacity.host_bytes // _slot(capacity.chunk_bytes),
        "disk_chunks": _disk_chunks(capacity),
        "unbounded_hit_rate": round(ceiling.hit_rate(), 5),
        "results": [r.to_json() for r in results],
    }
    if args.restart_every is not None:
        report["rolling_restarts"] = _rolling(args, requests, capacity, policies[0])
    if args.sweep:
        report["sweep"] = _sweep(args, requests, capacity, policies, blocks, ceiling.hit_rate(), results)
    if args.json:
        json.dump(report, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        _print_table(report, results)
        if "rolling_restarts" in report:
            _print_rolling(report["rolling_restarts"])
    return 0


def _rolling(args: argparse.Namespace, requests: list, capacity: Any, policy: str) -> dict[str, Any]:
    """A rolling upgrade with and without warm restart (``kvstore/sim/restarts.py``)."""
    from ..sim.restarts import check_plan, upgrade_cost

    plan = check_plan(args.fleet, args.restart_every, len(requests), capacity.gpu_bytes)
    return upgrade_cost(requests, capacity, plan, policy, args.block_tokens)


def _print_rolling(rolling: dict[str, Any]) -> None:
    first, last = rolling["window"]
    print(f"rolling upgrade: {rolling['restarts']} restarts of a fleet of {rolling['fleet']}, one every "
          f"{rolling['every']} requests (requests {first}..{last} affected)")
    for mode, label in (("none", "no restart"), ("cold", "cold restarts"), ("warm", "warm restarts")):
        r = rolling[mode]
        print(f"  {label:<14} {100 * r['hit_rate']:6.2f}% hit, {100 * r['window_hit_rate']:6.2f}% during the "
              f"upgrade (cost {100 * r['cost']:.2f} / {100 * r['window_cost']:.2f} points)")


def _capacity(args: argparse.Namespace) -> Any:
    from ..sim.replay import Capacity

    chunk = parse_size(args.chunk_bytes, "--chunk-bytes")
    host = parse_size(args.host_mem, "--host-mem")
    disk = parse_size(args.disk_size, "--disk-size")
    gpu = parse_size(args.gpu_mem, "--gpu-mem")
    if chunk <= 0:
        raise ConfigError("--chunk-bytes: must be positive (the KV bytes of one block, e.g. 64MiB)")
    if host < _slot(chunk):
        raise ConfigError(f"--host-mem: {format_size(host)} cannot hold one {format_size(chunk)} chunk; "
                          f"raise --host-mem or lower --chunk-bytes")
    if gpu and gpu < _slot(chunk):
        raise ConfigError(f"--gpu-mem: {format_size(gpu)} cannot hold one {format_size(chunk)} chunk; "
                          f"raise it or give 0 for no GPU tier")
    capacity = Capacity(host, disk, chunk, gpu)
    if disk and not _disk_chunks(capacity):
        raise ConfigError(f"--disk-size: {format_size(disk)} cannot hold one {format_size(chunk)} chunk file; "
                          f"raise it or give 0 for no disk tier")
    return capacity


def _tenants(args: argparse.Namespace, capacity: Any) -> Any:
    """The --tenants file's table, its guarantees checked against the simulated tiers (None without it)."""
    if args.tenants is None:
        return None
    from ..tenants.table import load_tenants

    return load_tenants(args.tenants, {"dram": capacity.host_bytes, "disk": capacity.disk_bytes or None,
                                       "gpu": capacity.gpu_bytes or None})


def _check_sweep_output(out: str) -> None:
    """--sweep needs matplotlib and a directory to write --out into; say so before any work is done."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("--sweep draws its plot with matplotlib, which is not installed: "
                          "pip install 'kvstore[sim]' (or drop --sweep)") from None
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise ConfigError(f"--out: directory {folder} does not exist; create it or give another path")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--out: directory {folder} is not writable; give another path")
    if os.path.isdir(out):
        raise ConfigError(f"--out: {out} is a directory; give a file name such as {os.path.join(out, 'sweep.png')}")


def _slot(chunk_bytes: int) -> int:
    return -(-chunk_bytes // 4096) * 4096


def _disk_chunks(capacity: Any) -> int:
    from ..tiers.disk.tier import DiskTier

    return capacity.disk_bytes // DiskTier.footprint(capacity.chunk_bytes) if capacity.disk_bytes else 0


def _sweep(args: argparse.Namespace, requests: list, capacity: Any, policies: list[str], blocks: int,
           ceiling: float, results: list) -> dict[str, Any]:
    from ..sim.sweep import plot, sweep

    points = sweep(requests, capacity.chunk_bytes, policies, blocks, block_tokens=args.block_tokens)
    configured = (capacity.host_bytes + capacity.disk_bytes, results[0].hit_rate())
    title = (f"{os.path.basename(args.trace)}: {len(requests):,} requests, {blocks:,} distinct blocks of "
             f"{format_size(capacity.chunk_bytes)}")
    plot(points, ceiling, args.out, configured if len(policies) == 1 else None, title)
    if not args.json:
        print(f"plot: {args.out}")
    return {"plot": args.out, "points": [{"policy": p.policy, "fraction": p.fraction,
                                          "capacity_bytes": p.capacity_bytes, "hit_rate": round(p.hit_rate, 5)}
                                         for p in points]}


def _print_table(report: dict[str, Any], results: list) -> None:
    blocks = report["distinct_blocks"]
    ceiling = report["unbounded_hit_rate"]
    print(f"{report['requests']:,} requests, {report['input_tokens']:,} input tokens, {blocks:,} distinct blocks "
          f"({format_size(blocks * report['chunk_bytes'])} at {format_size(report['chunk_bytes'])} a block)")
    print(f"host tier {format_size(report['host_bytes'])} = {report['host_chunks']:,} chunks "
          f"({100 * report['host_chunks'] / blocks:.1f} % of the blocks); disk tier "
          f"{format_size(report['disk_bytes'])} = {report['disk_chunks']:,} chunks "
          f"({100 * report['disk_chunks'] / blocks:.1f} %)")
    tiers = ["gpu", "host", "disk"] if report["gpu_bytes"] else ["host", "disk"]
    if report["gpu_bytes"]:
        print(f"GPU tier {format_size(report['gpu_bytes'])} = {report['gpu_chunks']:,} chunks "
              f"({100 * report['gpu_chunks'] / blocks:.1f} % of the blocks)")
    print(f"{'policy':<10} " + " ".join(f"{t:>7}" for t in tiers) + f" {'total':>7} {'of ceiling':>11} {'seconds':>8}")
    for r in results:
        share = r.hit_rate() / ceiling if ceiling else 0.0
        print(f"{r.policy:<10} " + " ".join(f"{100 * r.hit_rate(t):6.2f}%" for t in tiers)
              + f" {100 * r.hit_rate():6.2f}% {100 * share:10.1f}% {r.seconds:8.1f}")
        for name, row in r.tenants.items():
            rate = row["hit_tokens"] / row["input_tokens"] if row["input_tokens"] else 0.0
            print(f"  tenant {name:<12} {row['requests']:>8,} requests {100 * rate:6.2f}% hit, "
                  f"{row.get('evicted_by_others', 0):,} chunks evicted by others, "
                  f"{row.get('ceiling_refusals', 0):,} puts refused at its ceiling")
        if r.put_failures:
            print(f"  {r.put_failures:,} puts did not fit in the host tier (a request larger than it)")
    print(f"{'unbounded':<10} " + " ".join(f"{'':>7}" for _ in tiers) + f" {100 * ceiling:6.2f}%")
