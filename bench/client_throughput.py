"""Put/get throughput through the client over ipc:// and tcp://, next to memcpy; lookup latency.

    python -m bench.client_throughput [--quick] [--out FILE]

For each chunk size, a batch of 16 chunks is put (copied into the arena, committed) and read back into
destination buffers, as an engine copies into its KV cache (``get_into``, or a lease, a copy of each view and a
release). The reference is a plain in-process memcpy of the same bytes into the same destination buffers, timed
in the same round as the puts and gets so that all see the same machine noise; ratios are medians of per-round
ratios. Over ipc:// the paths of ``IPC_PATHS`` are measured in the same rounds, so the before/after ratios are
taken under the same load. Every client populates its whole mapping of the arena first (``populate_arena``), so
the figures are a running client's, not its first touches' (``KVS_BENCH_COLD=1``: those instead).

Lookup latency: one lookup of a 64-chunk prefix, from the shared index (walked in C, and in Python), over the
stream socket and over ZeroMQ (interleaved blocks), then the same with 8 client processes at once, each asking
every 0.5 ms. Writes
bench/results/client-throughput-latest.json and prints a Markdown table.
``--quick`` writes a temporary file instead (or ``--out``), never the committed results.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import kvstore
from bench._common import (add_output_flag, native_index, start_daemon, timed_put_get,
                     write_result)

SIZES = {"256KiB": 256 << 10, "2MiB": 2 << 20, "32MiB": 32 << 20}
BATCH = 16
WARM = os.environ.get("KVS_BENCH_COLD") != "1"   # 1: measure clients whose mappings are still unpopulated


# Each path measured over ipc://, interleaved in the same rounds: (client settings, how it puts and gets).
# ipc_into: puts into a credit (one round trip), gets copied straight out of the arena (get_into, no round trip);
# ipc_queued: the same with queued puts (put(wait=False): the get waits for the commit, so the sum is comparable);
# ipc: credit puts and leased gets (before get_into); ipc_reserve: reserve + commit puts; ipc_zmq: the path before
# the stream socket and the shared index (ZeroMQ for every request).
IPC_PATHS = {
    "ipc_into": ({}, {"into": True}),
    "ipc_queued": ({}, {"into": True, "wait": False}),
    "ipc": ({}, {}),
    "ipc_reserve": ({"credits": False}, {}),
    "ipc_zmq": ({"stream": False, "shared_index": False, "credits": False}, {}),
}


def measure_paths(address: str, paths: dict[str, dict], size: int, repeat: int) -> dict:
    """Interleave memcpy and each path's put and get in every round, so that all see the same machine noise."""
    clients = {name: kvstore.connect(address, namespace=f"bench-{name}-{size}", chunk_tokens=16, timeout=60, **kw)
               for name, (kw, _) in paths.items()}
    if WARM:
        for c in clients.values():
            c.populate_arena()   # steady state: each client's mapping as it is once its first requests have run
    payloads = [np.random.randint(0, 255, size, dtype=np.uint8) for _ in range(BATCH)]
    dests = [np.ones(size, dtype=np.uint8) for _ in range(BATCH)]
    times: dict[str, list[float]] = {"memcpy": []}
    for name in clients:
        times[f"{name}_put"], times[f"{name}_get"] = [], []
    for i in range(repeat + 1):
        t0 = time.perf_counter()
        for p, d in zip(payloads, dests):
            np.copyto(d, p)
        memcpy_s = time.perf_counter() - t0
        round_times = {"memcpy": memcpy_s}
        for name, c in clients.items():
            keys = c.chunk_keys([i + 1] * 16 * BATCH)
            round_times[f"{name}_put"], round_times[f"{name}_get"] = timed_put_get(c, keys, payloads, dests,
                                                                                   **paths[name][1])
        if i:  # the first round warms up
            for key, value in round_times.items():
                times[key].append(value)
    for c in clients.values():
        c.close()
    nbytes = size * BATCH
    med = statistics.median
    out = {"memcpy_GBps": nbytes / med(times["memcpy"]) / 1e9}
    for name in clients:
        put_t, get_t = times[f"{name}_put"], times[f"{name}_get"]
        out.update({f"{name}_put_GBps": nbytes / med(put_t) / 1e9, f"{name}_get_GBps": nbytes / med(get_t) / 1e9,
                    f"{name}_put_vs_memcpy": med([m / p for m, p in zip(times["memcpy"], put_t)]),
                    f"{name}_get_vs_memcpy": med([m / g for m, g in zip(times["memcpy"], get_t)])})
    if "ipc" in clients and "ipc_reserve" in clients:   # the A/B of the two puts, round by round
        out["ipc_put_speedup_vs_reserve"] = med([r / p for r, p in zip(times["ipc_reserve_put"], times["ipc_put"])])
    return out


# shared_index: the index walked in C (kvstore/native/walk.py, as the build made it); shared_index_python:
# walked in Python, as where the native library is not built. walk_floor: the floor of any lookup that reads this
# table, measured under the same load — the C walk of the same packed keys alone (no checks, no client, no note to
# the daemon), as memcpy is the floor of a copy.
LOOKUP_PATHS = {"shared_index": {}, "shared_index_python": {}, "stream": {"shared_index": False},
                "zmq": {"shared_index": False, "stream": False}, "walk_floor": {}}


def connect_lookup_client(address: str, name: str) -> kvstore.Client:
    c = kvstore.connect(address, namespace="bench-lookup", chunk_tokens=16, **LOOKUP_PATHS[name])
    if name == "shared_index_python" and c.shared_index is not None:
        c.shared_index.walk_in_python()
    return c


def lookup_call(c: kvstore.Client, name: str, keys: list[bytes]):
    """The call one lookup of ``keys`` by path ``name`` makes."""
    if name != "walk_floor":
        return lambda: c.lookup(keys)
    index = c.shared_index
    if index is None or not index.walks_in_c:
        return lambda: len(keys)   # no C walk here: no floor to measure
    packed = b"".join(keys)
    return lambda: index.bare_walk(packed)


def percentiles(lat: list[float]) -> dict:
    lat = sorted(lat)
    return {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6}


def measure_lookup(address: str, calls: int) -> dict:
    """One lookup of a 64-chunk prefix, by each path in turn (blocks of 50 calls, interleaved)."""
    clients = {name: connect_lookup_client(address, name) for name in LOOKUP_PATHS}
    first = next(iter(clients.values()))
    keys = first.chunk_keys(list(range(16 * 64)))
    first.put(keys, [b"x" * 4096] * 64)
    lat: dict[str, list[float]] = {name: [] for name in clients}
    calls_of = {name: lookup_call(c, name, keys) for name, c in clients.items()}
    for _ in range(max(1, calls // 50)):
        for name, call in calls_of.items():
            for _ in range(50):
                t0 = time.perf_counter()
                n = call()
                lat[name].append(time.perf_counter() - t0)
                assert n == 64
    out = {}
    for name, c in clients.items():
        call = calls_of[name]
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        out[name] = {**percentiles(lat[name]), "lookups_per_s": calls / (time.perf_counter() - t0)}
        c.close()
    return out


def _lookup_worker(address: str, name: str, calls: int, pause_s: float, start_at: float, out) -> None:
    c = connect_lookup_client(address, name)
    call = lookup_call(c, name, c.chunk_keys(list(range(16 * 64))))
    while time.time() < start_at:
        time.sleep(0.001)
    lat = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        lat.append(time.perf_counter() - t0)
        time.sleep(pause_s)
    c.close()
    out.put(lat)


def measure_concurrent_lookups(address: str, clients: int, calls: int, pause_s: float = 0.0005,
                               rounds: int = 3) -> dict:
    """``clients`` processes at once, each looking up the 64-chunk prefix every ``pause_s`` (an engine's
    scheduler asking for its waiting requests), by each path in turn, ``rounds`` times over (the medians of the
    rounds' percentiles: one round's p99 moves by 2x on this machine)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    per_round: dict[str, list[dict]] = {name: [] for name in LOOKUP_PATHS}
    for _ in range(rounds):
        for name in LOOKUP_PATHS:
            queue = ctx.Queue()
            start_at = time.time() + 3.0   # after every worker has connected
            procs = [ctx.Process(target=_lookup_worker, args=(address, name, calls, pause_s, start_at, queue))
                     for _ in range(clients)]
            for p in procs:
                p.start()
            lat = [x for _ in procs for x in queue.get(timeout=300)]
            for p in procs:
                p.join()
            per_round[name].append(percentiles(lat))
    out = {name: {key: statistics.median(r[key] for r in results) for key in results[0]}
           for name, results in per_round.items()}
    return {"clients": clients, "pause_s": pause_s, "rounds": rounds, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="fewer repetitions (writes a temporary file, not bench/results/)")
    add_output_flag(ap)
    args = ap.parse_args()
    repeat = 3 if args.quick else 9
    built = native_index()
    print(f"index walk in C: {built or 'not built (python setup.py build_ext --inplace): Python'}")
    d = start_daemon("--host-mem", "1536MiB", *(["--disk-size", "0"] if _has_disk_flag() else []))
    rows = []
    try:
        for label, size in SIZES.items():
            row = {"chunk": label}
            ipc = measure_paths(d.ipc, IPC_PATHS, size, repeat)
            tcp = measure_paths(d.tcp, {"tcp": ({}, {})}, size, repeat)
            row["ipc_memcpy_GBps"], row["tcp_memcpy_GBps"] = ipc.pop("memcpy_GBps"), tcp.pop("memcpy_GBps")
            row.update(ipc)
            row.update(tcp)
            rows.append(row)
        lookup = measure_lookup(d.ipc, 500 if args.quick else 3000)
        concurrent = measure_concurrent_lookups(d.ipc, 8, 200 if args.quick else 1000, rounds=1 if args.quick else 3)
    finally:
        d.stop()
    load = os.getloadavg()
    path = write_result("client-throughput", {"batch": BATCH, "rows": rows, "native_index_walk": built is not None,
                                              "lookup_64_chunks": lookup,
                                              "lookup_64_chunks_8_clients": concurrent, "load_average": load},
                        quick=args.quick, out=args.out)
    print("| chunk | memcpy GB/s | put (×memcpy) | get_into (×memcpy) | queued put / get_into (×) "
          "| leased get (×) | reserve+commit put (×) | ZeroMQ: put / get (×) | tcp put GB/s | tcp get GB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['chunk']} | {r['ipc_memcpy_GBps']:.2f} | {r['ipc_into_put_GBps']:.2f} "
              f"({r['ipc_into_put_vs_memcpy']:.2f}×) | {r['ipc_into_get_GBps']:.2f} "
              f"({r['ipc_into_get_vs_memcpy']:.2f}×) "
              f"| {r['ipc_queued_put_vs_memcpy']:.2f}× / {r['ipc_queued_get_vs_memcpy']:.2f}× "
              f"| {r['ipc_get_vs_memcpy']:.2f}× | {r['ipc_reserve_put_vs_memcpy']:.2f}× "
              f"| {r['ipc_zmq_put_vs_memcpy']:.2f}× / {r['ipc_zmq_get_vs_memcpy']:.2f}× "
              f"| {r['tcp_put_GBps']:.2f} | {r['tcp_get_GBps']:.2f} |")
    print("\nlookup of a 64-chunk prefix (p50 / p99 µs, lookups/s; 8 clients: p50 / p99):")
    for name in LOOKUP_PATHS:
        one, many = lookup[name], concurrent[name]
        print(f"  {name:19s} {one['p50_us']:6.0f} / {one['p99_us']:6.0f}  {one['lookups_per_s']:7.0f}/s   "
              f"8 clients {many['p50_us']:6.0f} / {many['p99_us']:6.0f}")
    print(f"load average {os.getloadavg()}\n{path}")


def _has_disk_flag() -> bool:
    from kvstore.config import SETTINGS
    return any(s.name == "disk_size" for s in SETTINGS)


if __name__ == "__main__":
    main()
