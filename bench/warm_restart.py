"""Warm restart: how soon a restarted daemon serves the DRAM tier its predecessor kept, and what a restart costs.

    python -m bench.warm_restart [--gib 8] [--quick] [--repeats 3] [--trace PATH] [--chunk-mib 2]

Part 1 (fill and restart): a daemon with ``--host-mem`` just above ``--gib`` and no disk tier is filled with
``--gib`` GiB of chunks through the client, stopped with SIGTERM and started again on the same socket. Measured
from the moment the new process is spawned: the first get served from DRAM (the oldest chunk, verified in the
first batch), and every kept chunk verified (the ``adoption`` report of ``stats`` says ``done``), with the
report's adopted / verified / dropped counts and the checksum throughput of the verification. The same is
measured after a crash (SIGKILL: the chunks come from the journal, ``kvstore/tiers/host/journal.py``) and after a
cold restart (``--no-adopt``), whose first get never hits. Warm, crash and cold restarts are interleaved, one of
each per repeat, and the medians are reported.

Part 2 (trace): the Mooncake conversation trace is replayed through a daemon whose DRAM tier holds a share of
the trace's blocks (payload scaled down to ``--payload`` bytes per 512-token block), as an engine's connector
would (lookup, get what hits, put the rest). After ``--warmup`` requests, the token hit rate over a window of
``--window`` requests before a restart is compared with the same-size window right after it, for a warm and a
cold restart. The trace's own trend moves the hit rate from one window to the next, so the window after the
restart is also compared with the same window in a replay without a restart (``vs_no_restart``). Skipped, with a
message, when the trace file is absent.

Every daemon runs in a scratch directory of its own under /tmp (socket, HOME and XDG dirs), with its own
``--host-mem``; its files in /dev/shm are named from that socket and removed at the end, so a running daemon of
the user is never touched. Writes bench/results/warm-restart-latest.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

import xxhash

import kvstore
from bench._common import write_result
from harness.daemons import sandbox_env
from kvstore.mapped.index_writer import index_path_for
from kvstore.mapped.arena import arena_path_for, shm_free
from kvstore.tiers.host.description import description_path_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "..", "shared", "traces", "conversation_trace.jsonl")
GIB = 1 << 30
MIB = 1 << 20
CHUNK_TOKENS = 256
BLOCK_TOKENS = 512
PROMPT_CHUNKS = 16        # chunks per put (one prompt's worth)
POLL_S = 0.005
STATS_POLL_S = 0.02       # a stats reply costs the daemon more than a get: asked less often while it verifies
TARGET_FIRST_HIT_S = 1.0
TARGET_ALL_VERIFIED_S = 2.0
TARGET_HIT_RATIO = 0.95


# -- one daemon in a sandbox -------------------------------------------------------------------------------------
@dataclass
class Sandboxed:
    """One ``kvstore serve`` in a scratch directory of its own; ``restart`` keeps the socket (and so the arena)."""

    workdir: str
    args: list[str]
    proc: subprocess.Popen | None = None
    spawned: float = 0.0            # time.monotonic() right before the last spawn

    @property
    def socket(self) -> str:
        return os.path.join(self.workdir, "kv.sock")

    @property
    def address(self) -> str:
        return "ipc://" + self.socket

    def env(self) -> dict[str, str]:
        return sandbox_env(self.workdir, {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})

    def start(self, *extra: str) -> None:
        """Spawn the daemon (``extra``: flags for this start only); returns at once."""
        cmd = [sys.executable, "-m", "kvstore", "serve", "--socket", self.socket, *self.args, *extra]
        log = open(os.path.join(self.workdir, "daemon.log"), "ab")
        with log:
            self.spawned = time.monotonic()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=self.workdir)

    def client(self, timeout: float = 30.0) -> kvstore.Client:
        return kvstore.connect(self.address, chunk_tokens=CHUNK_TOKENS, timeout=timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(kvstore.DaemonUnavailable), \
                    kvstore.connect(self.address, timeout=0.5, use_arena=False) as c:
                c.ping()
                return
            time.sleep(POLL_S)
        raise RuntimeError(f"daemon not ready after {timeout}s; see {self.workdir}/daemon.log")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120.0) -> float:
        """Signal the daemon and wait for it; returns the seconds it took to exit."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        began = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - began

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(os.path.join(self.workdir, "daemon.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def remove_files(self) -> None:
        """After the process is gone: its files in /dev/shm (named from its socket), then its directory."""
        arena = arena_path_for(self.socket)
        for path in (arena, description_path_for(arena), arena + ".journal", index_path_for(self.socket)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def sandboxed(args: Sequence[str]) -> Iterator[Sandboxed]:
    """A daemon that is always stopped and whose files are always removed, whatever happens."""
    workdir = tempfile.mkdtemp(prefix="kvs-warm-")   # short: an ipc:// path must stay under 108 bytes
    with open(os.path.join(workdir, "owner.pid"), "w") as f:   # whose it is, for a test session's hygiene check
        f.write(str(os.getpid()))
    d = Sandboxed(workdir, list(args))
    try:
        yield d
    finally:
        d.stop(signal.SIGKILL if d.proc is not None and d.proc.poll() is None else signal.SIGTERM, timeout=30)
        d.remove_files()


# -- part 1: fill, restart, measure ------------------------------------------------------------------------------
@dataclass
class Restart:
    """One restart, measured from the spawn of the new process."""

    mode: str                           # warm (SIGTERM, --adopt), crash (SIGKILL, --adopt) or cold (--no-adopt)
    stop_s: float                       # the signal to the exit of the old process
    ready_s: float                      # spawn to the first answered ping
    first_hit_s: float | None           # spawn to the first get served from DRAM (None: never within the wait)
    all_verified_s: float | None        # spawn to the adoption report's "done" (warm and crash)
    report: dict[str, Any] = field(default_factory=dict)
    checksum_gbps: float | None = None  # verified bytes / the report's seconds
    sample_identical: bool = True       # the chunks read back after it are the bytes put


@dataclass
class Fill:
    keys: list[bytes]
    base: bytes
    chunk: int


def stamped(base: bytes, index: int) -> bytes:
    """The payload of chunk ``index``: ``base`` with the index in its first 8 bytes (every chunk distinct)."""
    return index.to_bytes(8, "little") + base[8:]


def fill(d: Sandboxed, gib: float, chunk: int) -> Fill:
    """Put ``gib`` GiB of distinct chunks, ``PROMPT_CHUNKS`` per put, chained per prompt."""
    total = int(gib * GIB) // chunk
    base = os.urandom(chunk)
    keys: list[bytes] = []
    buffers = [bytearray(base) for _ in range(PROMPT_CHUNKS)]
    with d.client() as c:
        for start in range(0, total, PROMPT_CHUNKS):
            n = min(PROMPT_CHUNKS, total - start)
            prompt = c.chunk_keys(range(start * CHUNK_TOKENS, (start + n) * CHUNK_TOKENS))
            for i in range(n):
                buffers[i][:8] = (start + i).to_bytes(8, "little")
            if c.put(prompt, buffers[:n]) != n:
                raise RuntimeError(f"the daemon took fewer than {n} chunks at chunk {start}: is --host-mem too small?")
            keys += prompt
    return Fill(keys, base, chunk)


def first_hit(d: Sandboxed, key: bytes, expect: bytes, give_up_s: float) -> tuple[float, float | None]:
    """Poll from the spawn: (seconds to the first answered request, seconds to the first get of ``key`` that is
    served with the bytes ``expect``, None when none came within ``give_up_s``)."""
    ready: float | None = None
    deadline = d.spawned + give_up_s
    while time.monotonic() < deadline:
        d._check_alive()
        try:
            with d.client(timeout=1.0) as c:
                while time.monotonic() < deadline:
                    if ready is None:
                        c.ping()
                        ready = time.monotonic() - d.spawned
                    with c.get([key]) as views:
                        if views and bytes(views[0]) == expect:
                            return ready, time.monotonic() - d.spawned
                    time.sleep(POLL_S)
        except kvstore.DaemonUnavailable:
            time.sleep(POLL_S)
    return (ready if ready is not None else give_up_s), None


def all_verified(d: Sandboxed, give_up_s: float = 120.0) -> tuple[float | None, dict[str, Any]]:
    """Seconds from the spawn to the adoption report's ``done``, and the report."""
    deadline = d.spawned + give_up_s
    with d.client() as c:
        while time.monotonic() < deadline:
            report = c.stats()["adoption"]
            if report["state"] != "verifying":
                return time.monotonic() - d.spawned, report
            time.sleep(STATS_POLL_S)
        return None, c.stats()["adoption"]


def sample_identical(d: Sandboxed, f: Fill, count: int = 64) -> bool:
    """Whether ``count`` chunks spread over the fill are served with exactly the bytes put."""
    step = max(1, len(f.keys) // count)
    with d.client() as c:
        for i in range(0, len(f.keys), step):
            with c.get([f.keys[i]]) as views:
                if not views or bytes(views[0]) != stamped(f.base, i):
                    return False
    return True


def restart(d: Sandboxed, f: Fill, mode: str) -> Restart:
    """Stop the daemon (SIGKILL for ``crash``, else SIGTERM), start it again (``--no-adopt`` for ``cold``, else
    ``--adopt``) and measure (see ``Restart``)."""
    stop_s = d.stop(signal.SIGKILL if mode == "crash" else signal.SIGTERM)
    d.start("--no-adopt" if mode == "cold" else "--adopt")
    ready_s, hit_s = first_hit(d, f.keys[0], stamped(f.base, 0), give_up_s=3.0 if mode == "cold" else 10.0)
    if mode == "cold":
        d.stop()   # a daemon started with --no-adopt keeps nothing at its stop: the next fill needs one that does
        d.start("--adopt")
        d.wait_ready()
        return Restart(mode, round(stop_s, 3), round(ready_s, 3), hit_s, None)
    done_s, report = all_verified(d)
    seconds = report.get("seconds") or 0.0
    gbps = round(report["verified_bytes"] / seconds / 1e9, 2) if seconds else None
    return Restart(mode, round(stop_s, 3), round(ready_s, 3), _round(hit_s), _round(done_s), report, gbps,
                   sample_identical(d, f))


def part_restart(gib: float, chunk_mib: int, repeats: int) -> dict[str, Any]:
    """Fill, then per repeat a warm restart, a crash (what the warm one adopted, journaled as it was published)
    and a cold restart (refilled after it)."""
    chunk = chunk_mib * MIB
    host_mem = int(gib * GIB) + 64 * MIB
    need = host_mem + GIB
    if shm_free() < need:
        raise SystemExit(f"warm_restart: /dev/shm has {shm_free() // MIB} MiB free, {need // MIB} MiB needed; "
                         f"lower --gib")
    runs: dict[str, list[Restart]] = {"warm": [], "crash": [], "cold": []}
    fill_s: list[float] = []
    args = ["--host-mem", str(host_mem), "--disk-size", "0", "--log-level", "info"]
    with sandboxed(args) as d:
        d.start("--adopt")   # nothing to adopt in a fresh sandbox; its stop keeps the arena
        d.wait_ready()
        for i in range(repeats):
            began = time.monotonic()
            f = fill(d, gib, chunk)
            fill_s.append(time.monotonic() - began)
            for mode, done in runs.items():
                done.append(restart(d, f, mode))
                print(json.dumps({"repeat": i, mode: asdict(done[-1])}), flush=True)
    return {"gib": gib, "chunk_bytes": chunk, "chunks": len(f.keys), "host_mem": host_mem, "repeats": repeats,
            "fill_gbps_median": round(gib * GIB / statistics.median(fill_s) / 1e9, 2),
            **{mode: summarize(done) for mode, done in runs.items()},
            "runs": {mode: [asdict(r) for r in done] for mode, done in runs.items()}}


def summarize(runs: list[Restart]) -> dict[str, Any]:
    """Medians of the measured seconds (a run whose first hit never came counts as no hit), and the counts."""
    out: dict[str, Any] = {
        "stop_s": _median([r.stop_s for r in runs]),
        "ready_s": _median([r.ready_s for r in runs]),
        "first_hit_s": _median([r.first_hit_s for r in runs]),
        "first_hit_runs": sum(r.first_hit_s is not None for r in runs),
    }
    if runs and runs[0].mode != "cold":
        last = runs[-1].report
        out.update({
            "all_verified_s": _median([r.all_verified_s for r in runs]),
            "verify_seconds": _median([r.report.get("seconds") for r in runs]),
            "checksum_gbps": _median([r.checksum_gbps for r in runs]),
            "adopted_chunks": last.get("adopted_chunks"), "verified_chunks": last.get("verified_chunks"),
            "dropped_chunks": last.get("dropped_chunks"), "corrupt_chunks": last.get("corrupt_chunks"),
            "listed_chunks": last.get("listed_chunks"), "unfit_chunks": last.get("unfit_chunks"),
            "byte_identical": all(r.sample_identical for r in runs),
        })
    return out


# -- part 2: the trace, before and after a restart -----------------------------------------------------------------
@dataclass
class Window:
    requests: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0


def read_requests(path: str, count: int) -> list[tuple[int, list[int]]]:
    """(input_length, hash_ids) of the first ``count`` requests of the trace at ``path``."""
    from kvstore.sim.trace import read_trace

    return [(r.input_length, list(r.hash_ids)) for r in read_trace(path, limit=count, block_tokens=BLOCK_TOKENS)]


def block_key(block_id: int) -> bytes:
    return xxhash.xxh3_128_digest(b"trace-block:" + block_id.to_bytes(8, "little"))


def replay(c: kvstore.Client, requests: Sequence[tuple[int, list[int]]], payload: bytes) -> Window:
    """Serve ``requests`` as a connector would; the token hit rate they saw."""
    w = Window()
    for tokens, ids in requests:
        keys = [block_key(b) for b in ids]
        found = c.lookup(keys)
        if found:
            with c.get(keys[:found]) as views:
                found = len(views)
        w.requests += 1
        w.input_tokens += tokens
        w.hit_tokens += min(tokens, found * BLOCK_TOKENS)
        rest = keys[found:]
        if rest:
            with contextlib.suppress(kvstore.StoreFullError):
                c.put(rest, [payload] * len(rest), parent=keys[found - 1] if found else None)
    return w


def trace_run(requests: list[tuple[int, list[int]]], warmup: int, window: int, host_mem: int, payload: bytes,
              mode: str) -> dict[str, Any]:
    """Replay ``warmup`` requests, measure ``window`` more, restart (``mode``: warm, cold, or none: no restart),
    measure the ``window`` that follow."""
    args = ["--host-mem", str(host_mem), "--disk-size", "0", "--log-level", "warning"]
    with sandboxed(args) as d:
        d.start("--adopt")
        d.wait_ready()
        with d.client() as c:
            replay(c, requests[:warmup], payload)
            before = replay(c, requests[warmup:warmup + window], payload)
        if mode != "none":
            d.stop()
            d.start("--adopt" if mode == "warm" else "--no-adopt")
            d.wait_ready()
        with d.client() as c:
            after = replay(c, requests[warmup + window:warmup + 2 * window], payload)
    return {"before": round(before.hit_rate, 4), "after": round(after.hit_rate, 4),
            "ratio": round(after.hit_rate / before.hit_rate, 3) if before.hit_rate else None}


def part_trace(path: str, warmup: int, window: int, host_share: float, payload_bytes: int) -> dict[str, Any]:
    """Warm and cold restarts in the middle of the trace (see the module doc)."""
    if not os.path.isfile(path):
        print(f"warm_restart: trace {path} not found; skipping the trace replay (give one with --trace)")
        return {"skipped": f"trace {path} not found"}
    requests = read_requests(path, warmup + 2 * window)
    if len(requests) < warmup + 2 * window:
        raise SystemExit(f"warm_restart: the trace holds {len(requests)} requests; --warmup + 2 × --window "
                         f"needs {warmup + 2 * window}")
    distinct = len({b for _, ids in requests for b in ids})
    host_mem = max(16 * MIB, int(distinct * host_share) * payload_bytes)
    payload = os.urandom(payload_bytes)
    runs = {mode: trace_run(requests, warmup, window, host_mem, payload, mode) for mode in ("warm", "cold", "none")}
    baseline = runs["none"]["after"]
    for mode in ("warm", "cold"):   # the trace's own trend is in after / before; after / no restart isolates it
        runs[mode]["vs_no_restart"] = round(runs[mode]["after"] / baseline, 3) if baseline else None
    return {"trace": os.path.basename(path), "warmup_requests": warmup, "window_requests": window,
            "distinct_blocks": distinct, "host_share": host_share, "payload_bytes": payload_bytes,
            "host_mem": host_mem, "warm": runs["warm"], "cold": runs["cold"], "no_restart": runs["none"]}


# -- the report ------------------------------------------------------------------------------------------------------
def targets(restarts: dict[str, Any], trace: dict[str, Any]) -> dict[str, Any]:
    """The targets (stated for 8 GiB), each with whether it was met (None: not measured)."""
    warm = restarts["warm"]
    hit, done = warm["first_hit_s"], warm["all_verified_s"]
    ratio = trace.get("warm", {}).get("ratio")
    vs_none = trace.get("warm", {}).get("vs_no_restart")
    return {
        "first_hit_s_at_most": TARGET_FIRST_HIT_S, "first_hit_met": hit is not None and hit <= TARGET_FIRST_HIT_S,
        "all_verified_s_at_most": TARGET_ALL_VERIFIED_S,
        "all_verified_met": done is not None and done <= TARGET_ALL_VERIFIED_S,
        "hit_rate_ratio_at_least": TARGET_HIT_RATIO, "hit_rate_ratio_met": None if ratio is None else
        ratio >= TARGET_HIT_RATIO,
        "hit_rate_vs_no_restart_met": None if vs_none is None else vs_none >= TARGET_HIT_RATIO,
    }


def positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value
    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.warm_restart", description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=positive(float), default=8.0, help="GiB of DRAM to fill (default 8)")
    p.add_argument("--quick", action="store_true", help="1 GiB, 2 repeats, a shorter trace slice")
    p.add_argument("--repeats", type=positive(int), default=3, help="warm and cold restarts each (default 3)")
    p.add_argument("--chunk-mib", type=positive(int), default=2, help="MiB per chunk (default 2)")
    p.add_argument("--trace", default=TRACE, help="Mooncake-format trace (default: the shared conversation trace)")
    p.add_argument("--warmup", type=positive(int), default=3000, help="trace requests before the measured window")
    p.add_argument("--window", type=positive(int), default=500, help="trace requests per measured window")
    p.add_argument("--host-share", type=positive(float), default=0.5,
                   help="share of the replayed slice's distinct blocks the DRAM tier holds (default 0.5)")
    p.add_argument("--payload", type=positive(int), default=16 << 10, help="bytes per 512-token block")
    a = p.parse_args(argv)
    if a.quick:
        a.gib, a.repeats, a.warmup, a.window = 1.0, 2, 1000, 300
    if a.host_share > 1:
        p.error(f"--host-share must be at most 1, got {a.host_share}")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    restarts = part_restart(a.gib, a.chunk_mib, a.repeats)
    trace = part_trace(os.path.abspath(a.trace), a.warmup, a.window, a.host_share, a.payload)
    result = {"command": "python -m bench.warm_restart " + " ".join(sys.argv[1:] if argv is None else argv),
              "restart": restarts, "trace": trace, "targets": targets(restarts, trace)}
    path = write_result("warm-restart", result, quick=a.quick)
    print(json.dumps({"restart": {k: v for k, v in restarts.items() if k != "runs"}, "trace": trace,
                      "targets": result["targets"]}, indent=2))
    print("wrote", os.path.relpath(path, os.getcwd()))
    return 0


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


if __name__ == "__main__":
    sys.exit(main())
