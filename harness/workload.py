"""A verifying workload shared by the fault, load and fuzz tests and by bench/: payloads derived from their keys.

Every chunk's bytes are a pure function of its key (``payload_for``), so any reader can check any chunk it is
handed without knowing who wrote it: a mix-up of slots, a half-written chunk or a stale mapping shows up as a
``corrupt`` count, never as a silent pass.

A worker (``python harness/workload.py worker ...``, or ``run_worker``) loops like an engine: pick a prompt that
shares a prefix with earlier ones, ``lookup`` how much is stored, ``get`` and verify those chunks, release the
lease, ``put`` the rest. It prints one JSON line of counts at the end. With ``--tolerate-outage`` the daemon
may vanish under it (fault injection): calls that fail with DaemonUnavailable or a restart's VersionError are
counted as ``unavailable`` and the worker carries on; wrong bytes are still counted as ``corrupt``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import time
from dataclasses import asdict, dataclass

CHUNK_TOKENS = 16
NAMESPACE = "workload"


def size_for(key: bytes, lo: int = 1024, hi: int = 64 << 10) -> int:
    """A payload size derived from the key, in [lo, hi)."""
    return lo + int.from_bytes(key[:4], "little") % (hi - lo)


def payload_for(key: bytes, size: int | None = None) -> bytes:
    return random.Random(key).randbytes(size_for(key) if size is None else size)


def payload_ok(key: bytes, data: memoryview | bytes, size: int | None = None) -> bool:
    return bytes(data) == payload_for(key, size)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_anon_bytes(pid: int) -> int:
    """Anonymous resident memory of a process (heap: what leaks; shared-memory pages are not counted)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class Counts:
    lookups: int = 0
    gets: int = 0
    puts: int = 0
    releases: int = 0
    chunks_read: int = 0
    chunks_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    corrupt: int = 0          # chunks whose bytes were not the key's payload: must stay 0
    errors: int = 0           # unexpected errors
    unavailable: int = 0      # calls that failed because the daemon was down or restarting (tolerated outages)
    store_full: int = 0
    seconds: float = 0.0


def prompt_tokens(rng: random.Random, prefixes: int, max_chunks: int) -> list[int]:
    """Tokens of one prompt: a shared prefix (one of ``prefixes``) and a private continuation."""
    prefix = rng.randrange(prefixes)
    shared = rng.randint(1, max_chunks // 2 or 1)
    own = rng.randint(0, max_chunks - shared)
    tokens = [prefix * 1_000_003 + i for i in range(shared * CHUNK_TOKENS)]
    tokens += [rng.randrange(1 << 30) for _ in range(own * CHUNK_TOKENS)]
    return tokens


def one_request(client, rng: random.Random, counts: Counts, prefixes: int, max_chunks: int,
                acked=None) -> None:
    keys = client.chunk_keys(prompt_tokens(rng, prefixes, max_chunks))
    n = client.lookup(keys)
    counts.lookups += 1
    if n:
        lease = client.get(keys[:n])
        counts.gets += 1
        n = len(lease.views)  # chunks evicted since the lookup are simply not in the lease
        for key, view in zip(keys, lease.views):
            counts.chunks_read += 1
            counts.bytes_read += len(view)
            if not payload_ok(key, view):
                counts.corrupt += 1
        lease.release()
        counts.releases += 1
    rest = keys[n:]
    if rest:
        payloads = [payload_for(k) for k in rest]
        written = client.put(rest, payloads, parent=keys[n - 1] if n else None)
        counts.puts += 1
        counts.chunks_written += written
        counts.bytes_written += sum(len(p) for p in payloads)
        if acked is not None:
            acked.write("".join(k.hex() + "\n" for k in rest))
            acked.flush()


def run_worker(address: str, seconds: float, seed: int, prefixes: int = 64, max_chunks: int = 8,
               tolerate_outage: bool = False, acked_path: str | None = None, timeout: float = 5.0,
               stop_path: str | None = None, requests: int | None = None) -> Counts:
    """Loop like an engine for ``seconds``, or until a file appears at ``stop_path`` if one is given first (so
    that a test's own loop, however slow the machine, decides how long the workers run), or until ``requests``
    prompts were served (the same work on every run of a seed: what a benchmark compares)."""
    import kvstore

    rng = random.Random(seed)
    counts = Counts()
    acked = open(acked_path, "a") if acked_path else None
    start = time.monotonic()
    client = None
    served = 0
    while time.monotonic() - start < seconds and not (stop_path and os.path.exists(stop_path)):
        if requests is not None and served >= requests:
            break
        served += 1
        try:
            if client is None:
                client = kvstore.connect(address, namespace=NAMESPACE, chunk_tokens=CHUNK_TOKENS, timeout=timeout)
            one_request(client, rng, counts, prefixes, max_chunks, acked)
        except kvstore.StoreFullError:
            counts.store_full += 1
        except (kvstore.DaemonUnavailable, kvstore.VersionError, kvstore.LeaseError,
                kvstore.ReservationError) as exc:
            if not tolerate_outage:
                counts.errors += 1
                print(f"error: {exc!r}", file=sys.stderr)
            else:
                counts.unavailable += 1
                time.sleep(0.02)
        except Exception as exc:  # noqa: BLE001 - every other failure is an error to report
            counts.errors += 1
            print(f"error: {exc!r}", file=sys.stderr)
    counts.seconds = time.monotonic() - start
    if client is not None:
        client.close()
    if acked is not None:
        acked.close()
    return counts


def worker_command(address: str, seconds: float, seed: int, **options) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "worker", "--address", address,
           "--seconds", str(seconds), "--seed", str(seed)]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value not in (None, False):
            cmd += [flag, str(value)]
    return cmd


def parse_counts(stdout: str) -> Counts:
    return Counts(**json.loads(stdout.strip().splitlines()[-1]))


def total(counts: list[Counts]) -> Counts:
    out = Counts()
    for c in counts:
        for name, value in asdict(c).items():
            if name != "seconds":
                setattr(out, name, getattr(out, name) + value)
    out.seconds = max((c.seconds for c in counts), default=0.0)
    return out


def run_load(addresses: list[str], seconds: float, daemon_pid: int, sample_every: float = 1.0,
             **options) -> dict:
    """One worker process per address for ``seconds``; sample the daemon's heap meanwhile. Returns a report."""
    import subprocess

    procs = [subprocess.Popen(worker_command(a, seconds, seed=i, **options), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i, a in enumerate(addresses)]
    start = time.monotonic()
    rss = []
    while any(p.poll() is None for p in procs):
        rss.append((round(time.monotonic() - start, 2), rss_anon_bytes(daemon_pid)))
        time.sleep(sample_every)
    results, stderr = [], []
    for p in procs:
        out, err = p.communicate()
        stderr.append(err[-2000:])
        results.append(parse_counts(out) if p.returncode == 0 and out.strip() else Counts(errors=1))
    by_transport: dict[str, Counts] = {}
    for address, counts in zip(addresses, results):
        scheme = address.split(":", 1)[0]
        by_transport[scheme] = total([by_transport.get(scheme, Counts()), counts])
    requests = lambda c: c.lookups + c.gets + c.puts + c.releases  # noqa: E731
    warm = [b for t, b in rss if t >= seconds / 3] or [b for _, b in rss]
    return {
        "processes": len(addresses),
        "seconds": seconds,
        "total": asdict(total(results)),
        "requests_per_s": {k: round(requests(c) / max(c.seconds, 1e-9), 1) for k, c in by_transport.items()},
        "read_MBps": {k: round(c.bytes_read / max(c.seconds, 1e-9) / 1e6, 1) for k, c in by_transport.items()},
        "written_MBps": {k: round(c.bytes_written / max(c.seconds, 1e-9) / 1e6, 1) for k, c in by_transport.items()},
        "daemon_rss_anon_bytes": rss,
        "daemon_rss_growth_after_warmup_bytes": (warm[-1] - warm[0]) if warm else 0,
        "worker_stderr": [e for e in stderr if e.strip()],
    }


def main() -> None:
    p = argparse.ArgumentParser(description="a verifying kvstore client workload")
    p.add_argument("mode", choices=["worker"])
    p.add_argument("--address", required=True)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefixes", type=int, default=64)
    p.add_argument("--max-chunks", type=int, default=8)
    p.add_argument("--tolerate-outage", action="store_true")
    p.add_argument("--acked-path", default=None)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--stop-path", default=None, help="stop as soon as this file exists (--seconds is the cap)")
    p.add_argument("--requests", type=int, default=None, help="stop after this many prompts (--seconds is the cap)")
    a = p.parse_args()
    counts = run_worker(a.address, a.seconds, a.seed, a.prefixes, a.max_chunks, a.tolerate_outage,
                        a.acked_path, a.timeout, a.stop_path, a.requests)
    print(json.dumps(asdict(counts)), flush=True)


if __name__ == "__main__":
    main()
