"""What KV cache events cost and how fast a subscriber sees them.

    python -m bench.events [--quick] [--out JSON]

Two daemons of the same size run side by side, one publishing events (``--events-endpoint``, with replay) and
one not. Measured in the same run:

* put → ``BlockStored``: a subscriber in this process, connected to the publishing daemon, times from just
  before a one-chunk put to the moment the batch naming that chunk arrives (p50, p99 over many puts); and
  delete → ``BlockRemoved`` the same way.
* put throughput with events on and off: rounds of puts (8 chunks each, deleted after), the two daemons
  interleaved in short rounds (the order swapped each round) so both see the same machine load; the ratio is
  the median of the rounds' on/off ratios; once with 64 KiB chunks (the events' share of a put at its largest)
  and once with 1 MiB ones. A second subscriber is connected throughout and never reads (a stalled consumer).

Writes bench/results/events-latest.json; ``--quick`` writes a temporary file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import msgpack
import zmq
from bench._common import add_output_flag, short_tempdir, start_daemon, write_result

import kvstore
from kvstore.protocol.kv_events import block_hash

CHUNK = 64 << 10   # small chunks: the events' share of a put is at its largest
LARGE = 1 << 20    # still small next to a real model's chunk (Llama-3-8B, 256 tokens: 32 MiB)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wait_for_event(sub: zmq.Socket, kind: str, h: int, timeout_s: float = 5.0) -> float:
    """The time the batch with a ``kind`` event naming block hash ``h`` arrived."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if not sub.poll(100):
            continue
        _, _, payload = sub.recv_multipart()
        now = time.perf_counter()
        for event in msgpack.unpackb(payload)[1]:
            if event["type"] == kind and h in event["block_hashes"]:
                return now
    raise RuntimeError(f"no {kind} for {h:x} within {timeout_s}s")


def event_latency(c: kvstore.Client, sub: zmq.Socket, n: int) -> dict[str, float]:
    stored, removed = [], []
    payload = os.urandom(CHUNK)
    for _ in range(n):
        key = os.urandom(16)
        t0 = time.perf_counter()
        c.put([key], [payload])
        stored.append(wait_for_event(sub, "BlockStored", block_hash(key)) - t0)
        t0 = time.perf_counter()
        c.delete([key])
        removed.append(wait_for_event(sub, "BlockRemoved", block_hash(key)) - t0)
    return {"put_to_stored_p50_ms": percentile(stored, 0.5) * 1e3,
            "put_to_stored_p99_ms": percentile(stored, 0.99) * 1e3,
            "delete_to_removed_p50_ms": percentile(removed, 0.5) * 1e3,
            "delete_to_removed_p99_ms": percentile(removed, 0.99) * 1e3, "samples": n}


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
    """Median puts/s with events on, off, and the median of the rounds' on/off ratios. Short rounds, the order
    swapped each time, so both daemons see the same machine load."""
    on_rates, off_rates = [], []
    for i in range(rounds):
        first, second = (c_on, c_off) if i % 2 == 0 else (c_off, c_on)
        a, b = put_round(first, puts, chunk), put_round(second, puts, chunk)
        on_rates.append(a if first is c_on else b)
        off_rates.append(b if first is c_on else a)
    ratio = statistics.median(x / y for x, y in zip(on_rates, off_rates))
    return statistics.median(on_rates), statistics.median(off_rates), ratio


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    add_output_flag(parser)
    args = parser.parse_args()
    samples, rounds, puts = (100, 9, 30) if args.quick else (1000, 61, 60)
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
    try:
        with kvstore.connect(d_on.ipc, namespace="bench-events") as c_on, \
                kvstore.connect(d_off.ipc, namespace="bench-events") as c_off:
            time.sleep(0.5)   # the subscriptions reach the publisher
            result: dict = {"chunk_bytes": CHUNK, **event_latency(c_on, sub, samples)}
            sub.close(linger=0)   # from here only the stalled subscriber is connected
            on, off, ratio = compare(c_on, c_off, rounds, puts, CHUNK)
            result.update({"puts_per_s_events_on": on, "puts_per_s_events_off": off, "on_over_off": ratio,
                           "rounds": rounds, "puts_per_round": puts, "chunks_per_put": 8})
            on, off, ratio = compare(c_on, c_off, max(5, rounds // 3), max(5, puts // 6), LARGE)
            result.update({"large_chunk_bytes": LARGE, "large_puts_per_s_events_on": on,
                           "large_puts_per_s_events_off": off, "large_on_over_off": ratio,
                           "events_stats": c_on.stats()["events"]})
    finally:
        stalled.close(linger=0)
        ctx.term()
        d_on.stop()
        d_off.stop()
    path = write_result("events", result, quick=args.quick, out=args.out)
    print("| measure | value |\n| --- | --- |")
    print(f"| put → BlockStored, p50 / p99 | {result['put_to_stored_p50_ms']:.2f} / "
          f"{result['put_to_stored_p99_ms']:.2f} ms |")
    print(f"| delete → BlockRemoved, p50 / p99 | {result['delete_to_removed_p50_ms']:.2f} / "
          f"{result['delete_to_removed_p99_ms']:.2f} ms |")
    print(f"| puts/s, events on / off (8 × {CHUNK >> 10} KiB) | {result['puts_per_s_events_on']:.0f} / "
          f"{result['puts_per_s_events_off']:.0f} (median ratio {result['on_over_off']:.3f}) |")
    print(f"| puts/s, events on / off (8 × {LARGE >> 20} MiB) | {result['large_puts_per_s_events_on']:.0f} / "
          f"{result['large_puts_per_s_events_off']:.0f} (median ratio {result['large_on_over_off']:.3f}) |")
    print(f"\n{path}")


if __name__ == "__main__":
    main()
