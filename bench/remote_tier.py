"""The remote tier in the daemon: what a lookup costs with a remote store, and how fast a chunk travels between hosts.

    python -m bench.remote_tier [--quick] [--stores redis,mooncake]

For each store (a ``redis-server``, or ``mooncake_master`` plus one ``mooncake_client`` storage node, on loopback,
started by ``harness/servers.py``), two daemons A and B share it with ``--remote`` and a third daemon C runs
without it. Figures, medians over the repetitions:

* ``lookup_local_hit_us``: a lookup of 16 chunks B holds itself, next to the same lookup on C (no remote tier),
  and again while the store is frozen (SIGSTOP): a local hit never asks the store, so the three should match.
* ``lookup_miss_us``: a lookup of 16 chunks stored nowhere (one batched metadata call to the store), and while
  the store is frozen: the first such lookup waits ``--remote-wait``; after it the breaker answers at once.
* ``share_GBps``: A puts 16 fresh chunks of 2 MiB and its background puts reach the store (not timed); then B's
  lookup + get (each view copied into a destination buffer) is timed: payload GB/s from the store into B's
  engine, next to an in-process memcpy of the same bytes.

``--quick`` prints the JSON and writes nothing; the full run writes ``bench/results/remote-tier-latest.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench._common import memcpy_seconds, start_daemon, write_result
from harness.servers import MooncakeCluster, RedisServer, mooncake_binary

import kvstore

BATCH = 16
CHUNK = 2 << 20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def start_store(kind: str, workdir: Path):
    if kind == "redis":
        return RedisServer(workdir / "redis").start()
    return MooncakeCluster(workdir / "mooncake", segment_size="1GB", master=mooncake_binary("mooncake_master"),
                           node=mooncake_binary("mooncake_client")).start()


def frozen_process(kind: str, store):
    return store.master if kind == "mooncake" else store


def micros(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e6, 1)


def fresh_chain(client, seed: int) -> list[bytes]:
    return client.chunk_keys([seed * 1_000_003 + t for t in range(BATCH * 256)])


def wait_sent(a, before: int, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while a.stats()["remote"]["puts"] < before + n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"A's puts did not reach the store: {a.stats()['remote']}")
        time.sleep(0.01)


def run_store(kind: str, workdir: Path, repeat: int) -> dict:
    store = start_store(kind, workdir)
    daemons = []
    try:
        common = ("--host-mem", "512MiB", "--disk-size", "0")
        a_d, b_d = (start_daemon(*common, "--remote", store.url, tcp=False) for _ in range(2))
        c_d = start_daemon(*common, tcp=False)
        daemons = [a_d, b_d, c_d]
        a, b, c = (kvstore.connect(d.ipc, namespace="bench", timeout=30) for d in daemons)
        payloads = [np.random.randint(0, 255, CHUNK, dtype=np.uint8).tobytes() for _ in range(BATCH)]
        local = fresh_chain(b, 1)
        b.put(local, payloads)
        c.put(local, payloads)
        out: dict = {"lookup_local_hit_us": {
            "with_remote": micros(lambda: b.lookup(local), repeat * 20),
            "without_remote": micros(lambda: c.lookup(local), repeat * 20)}}
        nowhere = iter(range(10_000, 20_000))
        out["lookup_miss_us"] = {"store_up": micros(lambda: b.lookup(fresh_chain(b, next(nowhere))), repeat * 20)}
        frozen = frozen_process(kind, store)
        frozen.pause()
        try:
            out["lookup_local_hit_us"]["store_frozen"] = micros(lambda: b.lookup(local), repeat * 20)
            t0 = time.perf_counter()
            b.lookup(fresh_chain(b, next(nowhere)))
            out["lookup_miss_us"]["store_frozen_first"] = round((time.perf_counter() - t0) * 1e6, 1)
            out["lookup_miss_us"]["store_frozen_after"] = micros(lambda: b.lookup(fresh_chain(b, next(nowhere))),
                                                                 repeat * 20)
        finally:
            frozen.resume()
        deadline = time.monotonic() + 30   # lookups start the breaker's probes until one finds the store again
        while not b.stats()["remote"]["up"] and time.monotonic() < deadline:
            b.lookup(fresh_chain(b, next(nowhere)))
            time.sleep(0.1)
        dest = [bytearray(CHUNK) for _ in range(BATCH)]
        times = []
        for rep in range(repeat + 1):
            keys = fresh_chain(a, 100 + rep)
            before = a.stats()["remote"]["puts"]
            a.put(keys, payloads)
            wait_sent(a, before, BATCH)
            t0 = time.perf_counter()
            n = b.lookup(keys)
            with b.get(keys[:n]) as views:
                for view, d in zip(views, dest):
                    d[:] = view
                got = len(views)
            elapsed = time.perf_counter() - t0
            if got != BATCH:
                raise RuntimeError(f"B found {got} of {BATCH} chunks: {b.stats()['remote']}")
            if rep:
                times.append(elapsed)
        share = statistics.median(times)
        ref = memcpy_seconds(BATCH * CHUNK, repeat)
        out["share_GBps"] = round(BATCH * CHUNK / share / 1e9, 3)
        out["memcpy_GBps"] = round(BATCH * CHUNK / ref / 1e9, 3)
        out["share_vs_memcpy"] = round(ref / share, 4)
        out["remote_stats_b"] = b.stats()["remote"]
        for client in (a, b, c):
            client.close()
        return out
    finally:
        for d in daemons:
            d.stop()
        store.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions; print only")
    parser.add_argument("--stores", default="redis,mooncake")
    args = parser.parse_args()
    repeat = 3 if args.quick else 9
    import tempfile
    results = {}
    for kind in args.stores.split(","):
        log(f"{kind} ...")
        with tempfile.TemporaryDirectory(prefix="kvb-remote-") as tmp:
            results[kind] = run_store(kind, Path(tmp), repeat)
    payload = {"batch": BATCH, "chunk_bytes": CHUNK, "repeat": repeat, "stores": results}
    if not args.quick:
        log("wrote " + write_result("remote-tier", payload))
    print(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
