"""kvstore next to its peers: put/get throughput and batched-existence latency, with memcpy as reference.

    python -m bench.peers [--quick] [--peers kvstore-ipc,kvstore-tcp,mooncake,redis,lmcache]

Peers, each started by this script on loopback and stopped afterwards:

* ``kvstore-ipc`` / ``kvstore-tcp``: a ``kvstore serve`` daemon through the kvstore client (put; ``get_into``
  destination buffers, as an engine copies into its KV cache: straight from the arena where the shared index
  answers, else a lease and a copy of each view; lookup, which a local client answers from the daemon's shared
  index), its mapping of the arena populated at set-up as Mooncake registers its buffer. ``kvstore-ipc-zmq``: the same
  daemon through the local path before the stream socket and the shared index (every request through ZeroMQ), for a
  before/after ratio in one run.
* ``mooncake``: ``mooncake_master`` (built-in HTTP metadata server) plus one ``mooncake_client`` storage node,
  driven through the Python client over TCP: ``batch_put_from`` / ``batch_get_into`` on registered buffers,
  ``batch_is_exist``.
* ``redis``: ``redis-server`` through redis-py: one pipelined round trip of ``SET``s / ``GET``s (each value then
  copied into its destination buffer), and one ``EXISTS k1 .. k16``.
* ``lmcache``: LMCache's multiprocess server (``lmcache server``, L1 in DRAM) from its own virtualenv
  (``$LMCACHE_VENV``, default ``~/.cache/kvstore-bench/lmcache-venv``; ``--install-lmcache`` creates it with
  ``lmcache`` installed ``--no-deps`` plus its dependencies that need no CUDA, over the system's CPU torch), driven by a
  small worker run in that virtualenv through LMCache's engine-driven CPU path: register a KV layout, prepare/commit
  store into the server's shared-memory slots, lookup + prefetch, prepare/commit retrieve. Without a GPU this is the
  path an engine worker would use. Reported as unavailable, with the reason, when it is not installed or does not start;
  skipped by ``--quick`` (a cold start of its server alone takes ~45 s here).

For each chunk size (256 KiB, 2 MiB, 32 MiB) a batch of 16 chunks is put under fresh keys (then removed) and a
stored batch is read back; figures are medians over the repetitions, in GB/s of payload, each next to a plain
in-process memcpy of the same bytes measured in the same run. Existence latency is the median (and p99) round
trip of one batched existence query for the 16 stored keys.

``--quick`` (under a minute) prints one JSON object on stdout and writes nothing. The full run writes
``bench/results/peers-latest.json`` and its chart, ``peers-latest.png``, then prints the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench._common import (
    latest_path, machine, median_seconds, memcpy_seconds, sample_seconds, short_tempdir,
    start_daemon, write_result,
)
from bench.peer_payloads import BATCH, Payloads
from bench.peers_lmcache import LMCACHE_VENV, LMCachePeer, install_lmcache, lmcache_status

SIZES = {"256KiB": 256 << 10, "2MiB": 2 << 20, "32MiB": 32 << 20}
ALL_PEERS = ("kvstore-ipc", "kvstore-ipc-zmq", "kvstore-tcp", "mooncake", "redis", "lmcache")
# kvstore-ipc-zmq: the local path before the stream socket and the shared index (every request through ZeroMQ),
# measured in the same run so that the before/after ratio sees the same machine
KVSTORE_CLIENT_OPTIONS = {"kvstore-ipc": {}, "kvstore-ipc-zmq": {"stream": False, "shared_index": False},
                          "kvstore-tcp": {}}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def latency(fn, calls: int) -> dict:
    lat = sorted(sample_seconds(fn, calls))
    return {"exists_p50_us": lat[len(lat) // 2] * 1e6,
            "exists_p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6}


def timed_puts(put, remove, repeat: int, warmup: int) -> float:
    """Median seconds of ``put(i)`` over fresh key sets; each set but the last is removed after.

    Key sets ``0 .. warmup + repeat - 1``; the first ``warmup`` rounds are not timed.
    """
    times = []
    last = warmup + repeat - 1
    for i in range(last + 1):
        t0 = time.perf_counter()
        put(i)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        if i < last:
            remove(i)
    return statistics.median(times)


# ----------------------------------------------------------------- kvstore

def bench_kvstore(address: str, data: Payloads, repeat: int, warmup: int, calls: int, label: str) -> dict:
    import kvstore

    c = kvstore.connect(address, namespace=f"peers-{label}-{data.size}", chunk_tokens=16, timeout=120,
                        **KVSTORE_CLIENT_OPTIONS[label])
    c.populate_arena()   # set-up, as Mooncake registers its buffer: the puts below are a running client's
    keysets = [c.chunk_keys([i + 1] * 16 * BATCH) for i in range(warmup + repeat)]
    put_s = timed_puts(lambda i: c.put(keysets[i], data.src), lambda i: c.delete(keysets[i]), repeat, warmup)
    keys = keysets[-1]

    def get_once() -> None:   # into the caller's buffers, as an engine reads (a lease and copies where no index)
        assert c.get_into(keys, data.dst) == len(keys)

    data.clear()
    get_s = median_seconds(get_once, repeat, warmup)
    data.check()
    ex = latency(lambda: c.lookup(keys), calls)
    c.delete(keys)
    c.close()
    return {"put_s": put_s, "get_s": get_s, **ex}


# ---------------------------------------------------------------- mooncake

class MooncakePeer:
    def __init__(self, workdir: Path, segment: str):
        from harness.servers import MooncakeCluster, mooncake_binary
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        master, node = mooncake_binary("mooncake_master"), mooncake_binary("mooncake_client")
        if not master or not node:
            raise RuntimeError("mooncake_master/mooncake_client not installed (.ci/install-peers.sh)")
        self.cluster = MooncakeCluster(workdir, segment_size=segment, master=master, node=node)
        self.cluster.start()
        from mooncake.store import MooncakeDistributedStore
        self.store = MooncakeDistributedStore()
        rc = self.store.setup("127.0.0.1", self.cluster.metadata, 0, 64 << 20, "tcp", "",
                              self.cluster.master_address)
        if rc:
            raise RuntimeError(f"mooncake setup failed ({rc})")
        self.registered: set[int] = set()

    def register(self, arrays) -> list[int]:
        ptrs = []
        for a in arrays:
            p = a.ctypes.data
            if p not in self.registered:
                if self.store.register_buffer(p, a.nbytes):
                    raise RuntimeError("mooncake register_buffer failed")
                self.registered.add(p)
            ptrs.append(p)
        return ptrs

    def bench(self, data: Payloads, repeat: int, warmup: int, calls: int) -> dict:
        s = self.store
        src, dst = self.register(data.src), self.register(data.dst)
        sizes = [data.size] * BATCH
        names = [[f"peers-{data.size}-{i}-{j}" for j in range(BATCH)] for i in range(warmup + repeat)]

        def put(i):
            rc = s.batch_put_from(names[i], src, sizes)
            if any(rc):
                raise RuntimeError(f"mooncake put failed: {rc}")

        def remove(i):
            s.batch_remove(names[i], True)

        put_s = timed_puts(put, remove, repeat, warmup)
        keys = names[-1]

        def get_once():
            rc = s.batch_get_into(keys, dst, sizes)
            if rc != sizes:
                raise RuntimeError(f"mooncake get failed: {rc}")

        data.clear()
        get_s = median_seconds(get_once, repeat, warmup)
        data.check()
        ex = latency(lambda: s.batch_is_exist(keys), calls)
        s.batch_remove(keys, True)
        self.unregister()                  # the next size allocates new buffers
        return {"put_s": put_s, "get_s": get_s, **ex}

    def unregister(self) -> None:
        for p in self.registered:
            self.store.unregister_buffer(p)
        self.registered.clear()

    def close(self):
        self.unregister()
        self.store.close()
        self.cluster.stop()


# ------------------------------------------------------------------- redis

class RedisPeer:
    def __init__(self, workdir: Path):
        import shutil

        import redis
        from harness.servers import RedisServer
        if not shutil.which("redis-server"):
            raise RuntimeError("redis-server not installed (.ci/install-peers.sh)")
        self.server = RedisServer(workdir).start()
        self.client = redis.Redis(port=self.server.port, socket_timeout=60)

    def bench(self, data: Payloads, repeat: int, warmup: int, calls: int) -> dict:
        r = self.client
        names = [[f"peers:{data.size}:{i}:{j}" for j in range(BATCH)] for i in range(warmup + repeat)]

        def put(i):
            pipe = r.pipeline(transaction=False)
            for name, buf in zip(names[i], data.src):
                pipe.set(name, memoryview(buf))
            pipe.execute()

        put_s = timed_puts(put, lambda i: r.delete(*names[i]), repeat, warmup)
        keys = names[-1]

        def get_once():
            pipe = r.pipeline(transaction=False)
            for name in keys:
                pipe.get(name)
            for value, d in zip(pipe.execute(), data.dst):
                np.copyto(d, np.frombuffer(value, dtype=np.uint8))

        data.clear()
        get_s = median_seconds(get_once, repeat, warmup)
        data.check()
        ex = latency(lambda: r.exists(*keys), calls)
        r.delete(*keys)
        return {"put_s": put_s, "get_s": get_s, **ex}

    def close(self):
        self.client.close()
        self.server.stop()


# ------------------------------------------------------------------- main

def run(peers: list[str], quick: bool) -> dict:
    repeat = 2 if quick else 7
    calls = 200 if quick else 2000
    sizes = dict(SIZES)
    rows: list[dict] = []
    status: dict[str, str] = {}
    workdir = Path(short_tempdir("peers-"))   # in the run's scratch root, removed at exit
    live: dict[str, object] = {}
    daemon = None
    try:
        if any(p.startswith("kvstore") for p in peers):
            log("starting kvstore daemon")
            # DRAM only, like every peer here: with its disk tier on, sustained puts slow to disk speed by design
            # (write-back back-pressure), which bench/disk.py measures on its own.
            daemon = start_daemon("--host-mem", "1536MiB", "--disk-size", "0")
        if "mooncake" in peers:
            try:
                log("starting mooncake_master + storage node")
                live["mooncake"] = MooncakePeer(workdir / "mooncake", "2GB")
            except Exception as exc:   # noqa: BLE001 - report and go on with the others
                status["mooncake"] = f"unavailable: {exc}"
        if "redis" in peers:
            try:
                log("starting redis-server")
                live["redis"] = RedisPeer(workdir / "redis")
            except Exception as exc:   # noqa: BLE001
                status["redis"] = f"unavailable: {exc}"
        if "lmcache" in peers:
            reason = lmcache_status(quick)
            if reason:
                status["lmcache"] = "unavailable: " + reason
            else:
                try:
                    log("starting lmcache server")
                    live["lmcache"] = LMCachePeer(workdir / "lmcache", 6)
                except Exception as exc:   # noqa: BLE001
                    status["lmcache"] = f"unavailable: {exc}"

        for label, size in sizes.items():
            data = Payloads(size)
            big = quick and size >= (32 << 20)
            reps, warmup = (1, 0) if big else (repeat, 1)
            memcpy_s = memcpy_seconds(size * BATCH, max(reps, 3))
            nbytes = size * BATCH
            measured: dict[str, dict] = {}
            for peer in peers:
                if peer in status:
                    continue
                t_peer = time.monotonic()
                if peer in ("kvstore-ipc", "kvstore-ipc-zmq"):
                    measured[peer] = bench_kvstore(daemon.ipc, data, reps, warmup, calls, peer)
                elif peer == "kvstore-tcp":
                    measured[peer] = bench_kvstore(daemon.tcp, data, reps, warmup, calls, peer)
                elif peer in live:
                    try:
                        measured[peer] = live[peer].bench(data, reps, warmup, calls)
                    except Exception as exc:   # noqa: BLE001 - one failing peer does not sink the others
                        status[peer] = f"failed at {label}: {exc}"
                        continue
                log(f"{label}: {peer} {time.monotonic() - t_peer:.1f}s")
            memcpy_gbps = nbytes / memcpy_s / 1e9
            for peer, m in measured.items():
                put_gbps, get_gbps = nbytes / m["put_s"] / 1e9, nbytes / m["get_s"] / 1e9
                rows.append({
                    "peer": peer, "chunk": label, "chunk_bytes": size, "batch": BATCH, "repeat": reps, "warmup": warmup,
                    "put_GBps": round(put_gbps, 3), "get_GBps": round(get_gbps, 3),
                    "memcpy_GBps": round(memcpy_gbps, 3),
                    "put_vs_memcpy": round(put_gbps / memcpy_gbps, 3),
                    "get_vs_memcpy": round(get_gbps / memcpy_gbps, 3),
                    "exists_p50_us": round(m["exists_p50_us"], 1), "exists_p99_us": round(m["exists_p99_us"], 1),
                })
            del data
    finally:
        for peer in live.values():
            try:
                peer.close()
            except Exception as exc:   # noqa: BLE001
                log(f"closing a peer failed: {exc}")
        if daemon is not None:
            daemon.stop()
    for peer in peers:
        status.setdefault(peer, "measured")
    return {"benchmark": "peers", "quick": quick, "batch": BATCH, "sizes": list(sizes), "peers": status,
            "machine": machine(), "load_average": os.getloadavg(), "rows": rows}


def chart(result: dict, path: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: no chart (pip install matplotlib)")
        return None
    rows = result["rows"]
    peers = [p for p in ALL_PEERS if any(r["peer"] == p for r in rows)]
    sizes = result["sizes"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    width = 0.8 / max(1, len(peers))
    for ax, metric, title in ((axes[0], "put_GBps", "put (GB/s)"), (axes[1], "get_GBps", "get (GB/s)")):
        for i, peer in enumerate(peers):
            vals = [next((r[metric] for r in rows if r["peer"] == peer and r["chunk"] == s), 0) for s in sizes]
            ax.bar([x + i * width for x in range(len(sizes))], vals, width, label=peer)
        for x, s in enumerate(sizes):
            ref = next((r["memcpy_GBps"] for r in rows if r["chunk"] == s), None)
            if ref:
                ax.hlines(ref, x - width / 2, x + 0.8 - width / 2, colors="black", linestyles="dashed",
                          label="memcpy" if x == 0 else None)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(sizes))], [f"{s} ×{result['batch']}" for s in sizes])
        ax.set_title(title)
        ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    ax = axes[2]
    for i, peer in enumerate(peers):
        vals = [next((r["exists_p50_us"] for r in rows if r["peer"] == peer and r["chunk"] == s), 0) for s in sizes]
        ax.bar([x + i * width for x in range(len(sizes))], vals, width, label=peer)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(sizes))], sizes)
    ax.set_title(f"existence of {result['batch']} keys, p50 (µs)")
    ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    down = {p: s for p, s in result["peers"].items() if s.startswith("unavailable")}
    note = "; ".join(f"{p}: {s}" for p, s in down.items())
    fig.suptitle("kvstore and peers on loopback, medians" + (f"\n{note}"[:220] if note else ""), fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions; print JSON only, write nothing")
    ap.add_argument("--peers", default=",".join(ALL_PEERS), help="comma-separated subset of " + ",".join(ALL_PEERS))
    ap.add_argument("--install-lmcache", action="store_true",
                    help=f"create LMCache's virtualenv ({LMCACHE_VENV}, or $LMCACHE_VENV) first")
    args = ap.parse_args()
    if args.install_lmcache:
        install_lmcache()
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(peers) - set(ALL_PEERS)
    if unknown:
        ap.error(f"unknown peers: {', '.join(sorted(unknown))}")
    t0 = time.monotonic()
    result = run(peers, args.quick)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    if not args.quick:
        payload = {k: v for k, v in result.items() if k not in ("benchmark", "machine")}
        path = write_result("peers", payload)
        result["json"] = path
        png = chart(result, latest_path("peers", ".png"))
        if png:
            result["png"] = png
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
