"""What KV cache events cost and how fast a subscriber sees them.

    python -m bench.events [--quick] [--only SECTIONS] [--dynamo-python PYTHON] [--out JSON]

Sections (all by default; each starts daemons of its own, in the tests' sandbox):

* ``latency``: put → ``BlockStored`` and delete → ``BlockRemoved`` as a subscriber in this process sees them, from
  just before the call to the arrival of the batch naming the chunk (p50, p99): 500 isolated changes (10 ms
  apart, as a request's save comes), then 1,000 back to back (each the moment the previous event arrived, so
  each falls within the batch interval of the one before: ``kvstore/server/events/publisher.py``).
* ``evict``: put → ``BlockRemoved`` of the chunk that put evicts (a daemon whose DRAM is full, no disk tier): 500
  isolated puts (10 ms apart), then 1,000 back to back.
* ``small``: one client's puts/s with events on and off, two daemons interleaved in short rounds (A B, B A), the
  median of the on/off ratios of each block of two rounds; 8 × 64 KiB chunks and 8 × 1 MiB ones, a
  subscriber connected that never reads.
* ``snapshot``: a late joiner's snapshot of 1 M engine blocks (62,500 chunks of 16 blocks of 16 tokens, with their
  token ids) through the replay socket, from the request to its last frame.
* ``load``: bench/load.py's workload (8 processes, half ipc://, half tcp://, every chunk verified) on a daemon with
  events and one without, interleaved rounds of the same work (a fixed number of prompts per process, the same
  seeds on both): requests, puts and gets per second, the daemon's CPU time per request, the median of the on/off
  ratios of each block of two rounds (A B, B A: a daemon run right after itself is slower than one run after the
  other, and one ratio per round would count that order as the events' cost). First with a subscriber process
  reading every batch, then with that process stopped (SIGSTOP); once it runs again, the gap in ``seq`` it saw.
  Between the two, one more round on the daemon with events while a probe puts one chunk every 20 ms: put →
  ``BlockStored`` under load (p50, p99).
* ``control``: the ``load`` comparison between two daemons without events (in the result, ``events_on`` is the
  first, ``events_off`` the second): the bench's own noise floor.
* ``dynamo``: Dynamo's standalone KV indexer (``--dynamo-python``: a virtualenv's python with ai-dynamo-runtime)
  subscribed to a daemon, asked what it holds after puts, a delete and evictions.

Writes bench/results/events-latest.json (with the machine's load average at start and end); ``--quick`` writes a
temporary file, as does ``--out``.
"""

from __future__ import annotations

import argparse
import json
import re
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any, Callable

import msgpack
import zmq
from bench._common import (
    BenchDaemon, abba_first, abba_ratios, add_output_flag, free_port, short_tempdir, start_daemon, write_result,
)

import kvstore
from kvstore.errors import StoreFullError
from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.protocol.kv_events import END_SEQ, SNAPSHOT_REQUEST, block_hash
from harness.daemons import sandbox_env
from harness.workload import Counts, parse_counts, total, worker_command

CHUNK = 64 << 10   # small chunks: the events' share of a put is at its largest
LARGE = 1 << 20    # still small next to a real model's chunk (Llama-3-8B, 256 tokens: 32 MiB)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wait_for_event(sub: zmq.Socket, kind: str, h: int | None = None,
                   timeout_s: float = 5.0) -> tuple[float, list[int]]:
    """The time the next batch with a ``kind`` event (naming block hash ``h``; None: any) arrived, and that
    event's block hashes."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if not sub.poll(100):
            continue
        _, _, payload = sub.recv_multipart()
        now = time.perf_counter()
        for event in msgpack.unpackb(payload)[1]:
            if event["type"] == kind and (h is None or h in event["block_hashes"]):
                return now, event["block_hashes"]
    raise RuntimeError(f"no {kind}{'' if h is None else f' for {h:x}'} within {timeout_s}s")


def event_latency(c: kvstore.Client, sub: zmq.Socket, n: int, gap_s: float = 0.0,
                  prefix: str = "") -> dict[str, float]:
    """Put → ``BlockStored`` and delete → ``BlockRemoved`` of one chunk, ``n`` times, ``gap_s`` between them
    (0: each the moment the previous event arrived)."""
    stored, removed = [], []
    payload = os.urandom(CHUNK)
    for _ in range(n):
        if gap_s:
            time.sleep(gap_s)
        key = os.urandom(16)
        t0 = time.perf_counter()
        c.put([key], [payload])
        stored.append(wait_for_event(sub, "BlockStored", block_hash(key))[0] - t0)
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter()
        c.delete([key])
        removed.append(wait_for_event(sub, "BlockRemoved", block_hash(key))[0] - t0)
    return {f"{prefix}put_to_stored_p50_ms": percentile(stored, 0.5) * 1e3,
            f"{prefix}put_to_stored_p99_ms": percentile(stored, 0.99) * 1e3,
            f"{prefix}delete_to_removed_p50_ms": percentile(removed, 0.5) * 1e3,
            f"{prefix}delete_to_removed_p99_ms": percentile(removed, 0.99) * 1e3, f"{prefix}samples": n}


def drain(sub: zmq.Socket) -> None:
    """Drop what the subscriber has received (or receives within a millisecond)."""
    while sub.poll(1):
        sub.recv_multipart()


def eviction_latency(n: int, gap_s: float = 0.0, prefix: str = "") -> dict[str, float]:
    """put → ``BlockRemoved`` of the chunk it evicts: a daemon whose DRAM is full (no disk tier) evicts its least
    recently used chunk to make room for each new one; timed from just before the put to the batch naming the
    evicted chunk. ``gap_s`` between the puts (0: each as soon as the previous one's events were read)."""
    where = short_tempdir("eve-")
    endpoint = f"ipc://{where}/ev.sock"
    d = start_daemon("--host-mem", "16MiB", "--disk-size", "0", "--events-endpoint", endpoint, tcp=False)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    payload = os.urandom(CHUNK)
    put: set[int] = set()
    samples, skipped = [], 0
    try:
        with kvstore.connect(d.ipc, namespace="bench-events") as c:
            for _ in range((16 << 20) // CHUNK + 16):   # full, and evicting
                key = os.urandom(16)
                c.put([key], [payload])
                put.add(block_hash(key))
            drain(sub)
            for _ in range(n):
                if gap_s:
                    time.sleep(gap_s)
                key = os.urandom(16)
                t0 = time.perf_counter()
                c.put([key], [payload])
                try:
                    arrived, hashes = wait_for_event(sub, "BlockRemoved", timeout_s=1.0)
                except RuntimeError:   # room was made before this put (a refill of its credit): no sample
                    skipped += 1
                    continue
                finally:
                    put.add(block_hash(key))
                assert set(hashes) <= put, "an eviction of a chunk never put"
                samples.append(arrived - t0)
                drain(sub)
    finally:
        sub.close(linger=0)
        ctx.term()
        d.stop()
    return {f"{prefix}evict_to_removed_p50_ms": percentile(samples, 0.5) * 1e3,
            f"{prefix}evict_to_removed_p99_ms": percentile(samples, 0.99) * 1e3, f"{prefix}evict_samples": len(samples),
            f"{prefix}evict_puts_without_eviction": skipped}


SNAPSHOT_CHUNKS = 62_500          # chunks held when the snapshot is asked for
SNAPSHOT_BLOCKS_PER_CHUNK = 16    # engine blocks per chunk: 1,000,000 in all
SNAPSHOT_BLOCK_TOKENS = 16        # vLLM's default block size
SNAPSHOT_PROMPT_CHUNKS = 16       # chunks per prompt (a chain)


def fill_engine_blocks(c: kvstore.Client, chunks: int) -> None:
    """Put ``chunks`` small chunks, each naming ``SNAPSHOT_BLOCKS_PER_CHUNK`` engine blocks (hashes, parent, token
    ids), as prompts of ``SNAPSHOT_PROMPT_CHUNKS`` chained chunks."""
    per_chunk = SNAPSHOT_BLOCKS_PER_CHUNK * SNAPSHOT_BLOCK_TOKENS
    payload = b"\x01" * 512
    next_hash = 1
    for first in range(0, chunks, SNAPSHOT_PROMPT_CHUNKS):
        count = min(SNAPSHOT_PROMPT_CHUNKS, chunks - first)
        keys, engine, parent = [os.urandom(16) for _ in range(count)], [], None
        for _ in range(count):
            hashes = tuple(range(next_hash, next_hash + SNAPSHOT_BLOCKS_PER_CHUNK))
            next_hash += SNAPSHOT_BLOCKS_PER_CHUNK
            engine.append(EngineBlocks(SNAPSHOT_BLOCK_TOKENS, hashes, parent, tuple(range(per_chunk))))
            parent = hashes[-1]
        c.put(keys, [payload] * count, engine=engine)


def ask_snapshot(ctx: zmq.Context, replay: str) -> tuple[float, int, int]:
    """Ask the replay socket for a snapshot; the seconds to its last frame, the bytes received, and the engine
    blocks it names."""
    req = ctx.socket(zmq.DEALER)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(replay)
    received, payloads = 0, []
    try:
        t0 = time.perf_counter()
        req.send_multipart([b"", SNAPSHOT_REQUEST])
        while True:
            if not req.poll(30_000):
                raise RuntimeError("the replay socket did not answer the snapshot request")
            _, _, seq, payload = req.recv_multipart()
            received += len(payload)
            if seq == END_SEQ:
                break
            payloads.append(payload)
        elapsed = time.perf_counter() - t0
    finally:
        req.close(linger=0)
    blocks = sum(len(e["block_hashes"]) for p in payloads for e in msgpack.unpackb(p)[1] if e["type"] == "BlockStored")
    return elapsed, received, blocks


def snapshot_section(quick: bool) -> dict:
    """A late joiner's snapshot of 1 M engine blocks (62,500 chunks of 16), through the replay socket: from the
    request to its last frame (the end marker), the median of a few."""
    chunks = SNAPSHOT_CHUNKS // 10 if quick else SNAPSHOT_CHUNKS
    where = short_tempdir("evs-")
    replay = f"ipc://{where}/evr.sock"
    d = start_daemon("--host-mem", "256MiB", "--disk-size", "0", "--events-endpoint", f"ipc://{where}/ev.sock",
                     "--events-replay-endpoint", replay, tcp=False)
    ctx = zmq.Context()
    try:
        with kvstore.connect(d.ipc, namespace="bench-events") as c:
            t0 = time.perf_counter()
            fill_engine_blocks(c, chunks)
            fill_s = time.perf_counter() - t0
            held = c.stats()
            times, size, blocks = [], 0, 0
            for _ in range(3):
                elapsed, size, blocks = ask_snapshot(ctx, replay)
                times.append(elapsed)
    finally:
        ctx.term()
        d.stop()
    return {"snapshot": {"chunks": chunks, "engine_blocks": blocks, "seconds": statistics.median(times),
                         "all_seconds": times, "bytes": size, "fill_seconds": fill_s,
                         "daemon_chunks": held.get("chunks", held.get("count"))}}


def dynamo_section(python: str) -> dict:
    """Dynamo's standalone KV indexer (``python -m dynamo.indexer`` of ai-dynamo-runtime, in the virtualenv of
    ``python``) subscribed to a daemon's events: engine chunks put, one deleted, one evicted; the indexer asked
    what it holds (``/query`` with the token ids: its own hashes of them, matched against what it rebuilt from
    the events) after each step."""
    version = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('ai-dynamo-runtime'))"],
                             capture_output=True, text=True, timeout=60)
    if version.returncode != 0:
        return {"dynamo": {"ran": False, "python": python, "error": version.stderr.strip()[-500:]}}
    where = short_tempdir("evd-")
    port, replay_port, http = free_port(), free_port(), free_port()
    d = start_daemon("--host-mem", "1MiB", "--max-chunk", "256KiB", "--disk-size", "0", "--events-endpoint",
                     f"tcp://127.0.0.1:{port}", "--events-replay-endpoint", f"tcp://127.0.0.1:{replay_port}",
                     tcp=False)
    log = open(os.path.join(where, "indexer.log"), "w")
    indexer = subprocess.Popen([python, "-m", "dynamo.indexer", "--port", str(http), "--threads", "1"],
                               stdout=log, stderr=subprocess.STDOUT, env=sandbox_env(where))
    out: dict = {"ran": True, "package": f"ai-dynamo-runtime {version.stdout.strip()}", "steps": []}
    try:
        call = _http(f"http://127.0.0.1:{http}")
        _wait_http(call)
        out["register"] = call("/register", {"instance_id": 1, "endpoint": f"tcp://127.0.0.1:{port}",
                                             "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
                                             "model_name": "m", "block_size": 16})
        time.sleep(1.0)   # the subscription reaches the publisher
        prompts = [[p * 10_000 + i for i in range(256)] for p in range(1, 4)]   # 3 prompts, 4 chunks of 64 tokens
        with kvstore.connect(d.ipc, namespace="bench-dynamo") as c:
            keys = [_put_prompt(c, tokens) for tokens in prompts]
            out["steps"].append(_ask(call, "3 prompts put", prompts))
            c.delete(keys[1][2:])
            out["steps"].append(_ask(call, "prompt 2's last 2 chunks deleted", prompts))
            fillers = 0
            while fillers < 40 and _ask(call, "", prompts[:1])["matched_tokens"][0]:
                c.put([os.urandom(16)], [os.urandom(64 << 10)])   # DRAM (1 MiB) fills: the oldest chunks go first
                fillers += 1
            out["steps"].append(_ask(call, f"{fillers} chunks of 64 KiB more put (LRU evictions)", prompts))
    finally:
        indexer.terminate()
        indexer.wait(10)
        log.close()
        d.stop()
    with open(os.path.join(where, "indexer.log")) as f:
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in f]
    out["indexer_log"] = [line[-240:] for line in lines if "WARN" in line or "ERROR" in line or "eplay" in line][:8]
    return {"dynamo": out}


def _http(base: str) -> Callable[..., Any]:
    def call(path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(base + path, data, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
        try:
            return json.loads(text)
        except ValueError:
            return text
    return call


def _wait_http(call: Callable[..., Any], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call("/workers")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _put_prompt(c: kvstore.Client, tokens: list[int]) -> list[bytes]:
    """``tokens`` as chunks of 64 tokens (4 engine blocks of 16 each; the hashes are arbitrary, Dynamo keys blocks
    by its own hash of their token ids); returns the chunk keys."""
    keys, engine, parent = [], [], None
    for first in range(0, len(tokens), 64):
        hashes = tuple(hash((tuple(tokens[:first + 16 * (b + 1)]),)) & (2**63 - 1) for b in range(4))
        engine.append(EngineBlocks(16, hashes, parent, tuple(tokens[first:first + 64])))
        keys.append(os.urandom(16))
        parent = hashes[-1]
    c.put(keys, [os.urandom(1024)] * len(keys), engine=engine)
    return keys


def _ask(call: Callable[..., Any], step: str, prompts: list[list[int]]) -> dict:
    time.sleep(0.5)   # the events reach the indexer
    return {"step": step, "matched_tokens": [call("/query", {"token_ids": t, "model_name": "m"}).get("instances")
                                             for t in prompts]}


def put_round(c: kvstore.Client, puts: int, chunk: int = CHUNK) -> float:
    """Puts per second over ``puts`` puts of 8 chunks of ``chunk`` bytes (each put's chunks deleted after it)."""
    payloads = [os.urandom(chunk) for _ in range(8)]
    t0 = time.perf_counter()
    for _ in range(puts):
        keys = [os.urandom(16) for _ in range(8)]
        c.put(keys, payloads)
        c.delete(keys)
    return puts / (time.perf_counter() - t0)


def compare(c_on: kvstore.Client, c_off: kvstore.Client, rounds: int, puts: int,
            chunk: int) -> tuple[float, float, float]:
    """Median puts/s with events on, off, and the median of the on/off ratios of blocks of two rounds (``abba_first``).
    Short rounds, so both daemons see the same machine load."""
    on_rates, off_rates = [], []
    for i in range(rounds):
        first, second = (c_on, c_off) if abba_first(i) else (c_off, c_on)
        a, b = put_round(first, puts, chunk), put_round(second, puts, chunk)
        on_rates.append(a if first is c_on else b)
        off_rates.append(b if first is c_on else a)
    ratio = statistics.median(abba_ratios(on_rates, off_rates))
    return statistics.median(on_rates), statistics.median(off_rates), ratio


LOAD_PROCESSES = 8
LOAD_FLAGS = ("--host-mem", "256MiB")   # bench/load.py's daemon
STALLED_HWM = 1000   # batches ZeroMQ keeps for the stopped subscriber (the default keeps 100,000)


def load_round(d: BenchDaemon, prompts: int, seed: int) -> tuple[Counts, float]:
    """``LOAD_PROCESSES`` workers of bench/load.py (half ipc://, half tcp://) on ``d``, each serving ``prompts``
    prompts seeded from ``seed`` (the same work whichever daemon a round runs on); their counts and the daemon's
    CPU seconds meanwhile."""
    addresses = [d.ipc if i % 2 == 0 else d.tcp for i in range(LOAD_PROCESSES)]
    procs = [subprocess.Popen(worker_command(a, 600, seed=seed + i, timeout=30, requests=prompts),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, a in enumerate(addresses)]
    cpu0 = cpu_seconds(d.proc.pid)
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0 or not out.strip():
            raise RuntimeError(f"a load worker failed ({p.returncode}): {err[-500:]}")
        results.append(parse_counts(out))
    return total(results), cpu_seconds(d.proc.pid) - cpu0


def cpu_seconds(pid: int) -> float:
    """CPU time a process used so far, all its threads (ZeroMQ's I/O thread included), user and system."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rates(c: Counts, cpu: float) -> dict[str, float]:
    """Puts, gets and requests per second of one round, and the daemon's CPU time per request."""
    seconds = max(c.seconds, 1e-9)
    requests = c.lookups + c.gets + c.puts + c.releases
    return {"puts_per_s": c.puts / seconds, "gets_per_s": c.gets / seconds, "requests_per_s": requests / seconds,
            "daemon_cpu_us_per_request": cpu / max(requests, 1) * 1e6}


def load_compare(d_on: BenchDaemon, d_off: BenchDaemon, rounds: int, prompts: int, seed: int) -> dict:
    """bench/load.py's workload on the daemon with events and the one without, interleaved in rounds (A B, B A:
    ``abba_first``; the same seeds on both): median rates, and the median of the on/off ratios of blocks of two
    rounds (``abba_ratios``)."""
    on, off, errors = [], [], 0
    for d in (d_on, d_off):   # a warm-up round each, not counted: both daemons' DRAM full, as in the rounds after
        load_round(d, prompts, seed=seed + 999_000)
    for i in range(rounds):
        order = (d_on, d_off) if abba_first(i) else (d_off, d_on)
        for d in order:
            counts, cpu = load_round(d, prompts, seed=seed + 1000 * i)
            errors += counts.errors + counts.corrupt
            (on if d is d_on else off).append(rates(counts, cpu))
    out: dict = {"rounds": rounds, "prompts_per_process": prompts, "processes": LOAD_PROCESSES,
                 "errors_and_corrupt": errors}
    for name in ("puts_per_s", "gets_per_s", "requests_per_s", "daemon_cpu_us_per_request"):
        out[f"{name}_events_on"] = statistics.median(r[name] for r in on)
        out[f"{name}_events_off"] = statistics.median(r[name] for r in off)
        ratios = abba_ratios([r[name] for r in on], [r[name] for r in off])
        out[f"{name}_on_over_off"] = statistics.median(ratios) if ratios else None
    out["requests_per_s_round_ratios"] = [round(a["requests_per_s"] / b["requests_per_s"], 3) for a, b in zip(on, off)]
    out["requests_per_s_block_ratios"] = [round(r, 3) for r in abba_ratios([r["requests_per_s"] for r in on],
                                                                            [r["requests_per_s"] for r in off])]
    return out


PROBE_GAP_S = 0.02   # between the probe's puts: each a change of its own, as a request's save is
ISOLATED_GAP_S = 0.01   # between the latency section's isolated changes: longer than a batch interval


def latency_under_load(d: BenchDaemon, endpoint: str, prompts: int, seed: int) -> dict[str, float]:
    """Put → ``BlockStored`` as a subscriber in this process sees it, for one chunk put every ``PROBE_GAP_S``
    while a round of the load runs on ``d`` (the probe's puts share the loop and its batches with the load's)."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    load = threading.Thread(target=load_round, args=(d, prompts, seed))
    samples: list[float] = []
    refused = 0
    payload = os.urandom(CHUNK)
    try:
        with kvstore.connect(d.ipc, namespace="bench-events-probe") as c:
            time.sleep(0.5)   # the subscription reaches the publisher
            load.start()
            time.sleep(1.0)   # the load is under way
            while load.is_alive():
                key = os.urandom(16)
                t0 = time.perf_counter()
                try:
                    c.put([key], [payload])
                except StoreFullError:   # write-back behind under the load: refused, as the load's own puts are
                    refused += 1
                else:
                    samples.append(wait_for_event(sub, "BlockStored", block_hash(key))[0] - t0)
                    c.delete([key])
                time.sleep(PROBE_GAP_S)
    finally:
        load.join()
        sub.close(linger=0)
        ctx.term()
    return {"put_to_stored_under_load_p50_ms": percentile(samples, 0.5) * 1e3,
            "put_to_stored_under_load_p99_ms": percentile(samples, 0.99) * 1e3, "under_load_samples": len(samples),
            "under_load_puts_refused": refused}


def subscriber(endpoint: str, workdir: str) -> tuple[subprocess.Popen, str]:
    """A subscriber process (``python -m bench.events --subscribe``: decodes every batch, counts events and gaps
    in ``seq``) connected to ``endpoint``; returns it and the file it reports to when terminated."""
    report = os.path.join(workdir, "subscriber.json")
    proc = subprocess.Popen([sys.executable, "-m", "bench.events", "--subscribe", endpoint, "--out", report],
                            env=sandbox_env(workdir))
    return proc, report


def subscribe(endpoint: str, report: str) -> None:
    """Receive and decode every batch until SIGTERM, then write what was seen (events, batches, gaps) to
    ``report``."""
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    seen = {"batches": 0, "events": 0, "gaps": 0, "missed_batches": 0, "first_gap": None}
    expected = None
    while not stop:
        if not sub.poll(100):
            continue
        _, seq_raw, payload = sub.recv_multipart()
        seq = int.from_bytes(seq_raw, "big")
        if expected is not None and seq > expected:
            seen["gaps"] += 1
            seen["missed_batches"] += seq - expected
            seen["first_gap"] = seen["first_gap"] or [expected, seq - 1]
        expected = seq + 1
        seen["batches"] += 1
        seen["events"] += len(msgpack.unpackb(payload)[1])
    with open(report, "w") as f:
        json.dump(seen, f)
    sub.close(linger=0)
    ctx.term()


def load_section(quick: bool) -> dict:
    """bench/load.py's 8 processes on a daemon with events and one without, first with a real subscriber
    process reading, then with that subscriber stopped (SIGSTOP): throughput ratios, and the gap it sees once it
    runs again (its queue is ``--events-hwm`` batches)."""
    rounds, prompts = (2, 50) if quick else (16, 400)
    where = short_tempdir("evl-")
    endpoint = f"ipc://{where}/ev.sock"
    d_on = start_daemon(*LOAD_FLAGS, "--events-endpoint", endpoint, "--events-replay-endpoint",
                        f"ipc://{where}/evr.sock", "--events-hwm", str(STALLED_HWM))
    d_off = start_daemon(*LOAD_FLAGS)
    sub, report = subscriber(endpoint, where)
    try:
        time.sleep(1.0)   # the subscription reaches the publisher
        live = load_compare(d_on, d_off, rounds, prompts, seed=0)
        live.update(latency_under_load(d_on, endpoint, prompts, seed=500_000))
        sub.send_signal(signal.SIGSTOP)
        stalled = load_compare(d_on, d_off, rounds, prompts, seed=1_000_000)
        with kvstore.connect(d_on.ipc, namespace="bench-events") as c:
            stats = c.stats()["events"]
            sub.send_signal(signal.SIGCONT)
            time.sleep(2.0)   # it reads what ZeroMQ kept for it
            c.put([os.urandom(16)], [b"x" * 1024])   # one batch more: the first after the gap
            time.sleep(1.0)
    finally:
        sub.send_signal(signal.SIGCONT)
        sub.terminate()
        sub.wait(10)
        d_on.stop()
        d_off.stop()
    with open(report) as f:
        seen = json.load(f)
    return {"load": {"live_subscriber": live, "stalled_subscriber": stalled, "stalled_hwm_batches": STALLED_HWM,
                     "subscriber_saw": seen, "events_stats_after_stall": stats,
                     "load_average_1m": os.getloadavg()[0]}}


def control_section(quick: bool) -> dict:
    """The load section's comparison between two daemons that both run without events: how far from 1 the
    bench's own ratio falls when nothing differs (its noise floor on this machine)."""
    rounds, prompts = (2, 50) if quick else (16, 400)
    a, b = start_daemon(*LOAD_FLAGS), start_daemon(*LOAD_FLAGS)
    try:
        same = load_compare(a, b, rounds, prompts, seed=2_000_000)
    finally:
        a.stop()
        b.stop()
    return {"control": {"same_daemons": same, "load_average_1m": os.getloadavg()[0]}}


SECTIONS = ("latency", "evict", "small", "snapshot", "load", "control", "dynamo")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections to run (of {', '.join(SECTIONS)}; default: all)")
    parser.add_argument("--dynamo-python", metavar="PYTHON",
                        help="the python of a virtualenv with ai-dynamo-runtime installed (the dynamo section)")
    parser.add_argument("--subscribe", metavar="ENDPOINT", help=argparse.SUPPRESS)   # the subscriber process
    add_output_flag(parser)
    args = parser.parse_args()
    if args.subscribe:
        subscribe(args.subscribe, args.out)
        return
    sections = args.only.split(",")
    result: dict = {"load_average_start": os.getloadavg()}
    if "latency" in sections or "small" in sections:
        result.update(single_client_sections(args.quick, sections))
    if "evict" in sections:
        result.update(eviction_latency(50 if args.quick else 500, gap_s=ISOLATED_GAP_S))
        result.update(eviction_latency(100 if args.quick else 1000, prefix="back_to_back_"))
    if "snapshot" in sections:
        result.update(snapshot_section(args.quick))
    if "load" in sections:
        result.update(load_section(args.quick))
    if "control" in sections:
        result.update(control_section(args.quick))
    if "dynamo" in sections:
        result.update(dynamo_section(args.dynamo_python) if args.dynamo_python else
                      {"dynamo": {"ran": False, "error": "no --dynamo-python given"}})
    result["load_average_end"] = os.getloadavg()
    path = write_result("events", result, quick=args.quick, out=args.out)
    print(json.dumps(result, indent=1))
    print(f"\n{path}")


def single_client_sections(quick: bool, sections: list[str]) -> dict:
    """One client: put → BlockStored and delete → BlockRemoved latency, and puts/s with events on and off."""
    samples, rounds, puts = (100, 10, 30) if quick else (1000, 62, 60)
    where = short_tempdir("ev-")
    endpoint, replay = f"ipc://{where}/ev.sock", f"ipc://{where}/evr.sock"
    size = ["--host-mem", "128MiB", "--disk-size", "0"]
    d_on = start_daemon(*size, "--events-endpoint", endpoint, "--events-replay-endpoint", replay, tcp=False)
    d_off = start_daemon(*size, tcp=False)
    ctx = zmq.Context()
    sub, stalled = ctx.socket(zmq.SUB), ctx.socket(zmq.SUB)
    for s in (sub, stalled):
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.setsockopt(zmq.RCVHWM, 1000)
        s.connect(endpoint)
    result: dict = {}
    try:
        with kvstore.connect(d_on.ipc, namespace="bench-events") as c_on, \
                kvstore.connect(d_off.ipc, namespace="bench-events") as c_off:
            time.sleep(0.5)   # the subscriptions reach the publisher
            if "latency" in sections:
                result.update({"chunk_bytes": CHUNK, "isolated_gap_s": ISOLATED_GAP_S,
                               **event_latency(c_on, sub, samples // 2, gap_s=ISOLATED_GAP_S),
                               **event_latency(c_on, sub, samples, prefix="back_to_back_")})
            sub.close(linger=0)   # from here only the stalled subscriber is connected
            if "small" in sections:
                on, off, ratio = compare(c_on, c_off, rounds, puts, CHUNK)
                result.update({"puts_per_s_events_on": on, "puts_per_s_events_off": off, "on_over_off": ratio,
                               "rounds": rounds, "puts_per_round": puts, "chunks_per_put": 8})
                on, off, ratio = compare(c_on, c_off, max(6, rounds // 3 // 2 * 2), max(5, puts // 6), LARGE)
                result.update({"large_chunk_bytes": LARGE, "large_puts_per_s_events_on": on,
                               "large_puts_per_s_events_off": off, "large_on_over_off": ratio})
            result["events_stats"] = c_on.stats()["events"]
    finally:
        stalled.close(linger=0)
        ctx.term()
        d_on.stop()
        d_off.stop()
    return result


if __name__ == "__main__":
    main()
