"""What another local user's client pays: puts and gets inline on the stream socket, beside the arena's path.

    python -m bench.inline_stream [--chunk 4MiB] [--batch 8] [--repeats 15] [--quick] [--out FILE]

One daemon; three clients of the daemon's own user, one per path a local client can take: ``arena`` (the default:
the bytes are copied into and out of the shared arena), ``stream-inline`` (``use_arena=False``: the bytes travel in
the messages on the stream socket, as a ``socket_group`` member's client is served, ``docs/operations/tenants.md``)
and ``zeromq-inline`` (``use_arena=False, stream=False``: the same bytes in ZeroMQ frames). Each repeat puts
``--batch`` chunks of ``--chunk`` bytes with one client, reads them back into buffers of its own (``get_into``),
checks them and deletes them; the three paths take turns within every repeat. Reported: the median put and get
bandwidth of each path (GB/s) and each inline path's median time as a share of the arena's. Writes
bench/results/inline-stream-latest.json (``--quick``: a temporary file) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

import kvstore
from bench._common import add_output_flag, start_daemon, timed_put_get, write_result
from kvstore.units import parse_size

PATHS = {"arena": {}, "stream-inline": {"use_arena": False}, "zeromq-inline": {"use_arena": False, "stream": False}}


def run(address: str, chunk: int, batch: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Seconds of each repeat's put and get, per path; the paths take turns (the first rotates)."""
    clients = {name: kvstore.connect(address, namespace="bench", timeout=60, **kw) for name, kw in PATHS.items()}
    times: dict[str, dict[str, list[float]]] = {name: {"put": [], "get": []} for name in PATHS}
    payloads = [np.random.randint(0, 255, chunk, dtype=np.uint8) for _ in range(batch)]
    dests = [np.empty(chunk, dtype=np.uint8) for _ in range(batch)]
    names = list(PATHS)
    try:
        for i in range(repeats + 1):   # the first round warms every path up and is not kept
            for name in names[i % 3:] + names[:i % 3]:
                keys = [os.urandom(16) for _ in range(batch)]
                put, get = timed_put_get(clients[name], keys, payloads, dests, into=True)
                if i:
                    times[name]["put"].append(put)
                    times[name]["get"].append(get)
    finally:
        for client in clients.values():
            client.close()
    return times


def summary(times: dict[str, dict[str, list[float]]], nbytes: int) -> dict[str, dict[str, float]]:
    """Median GB/s of each path's puts and gets, and its median time over the arena's."""
    out = {}
    for name, sides in times.items():
        row: dict[str, float] = {}
        for side, samples in sides.items():
            med = statistics.median(samples)
            row[f"{side}_gbps"] = round(nbytes / med / 1e9, 3)
            row[f"{side}_x_arena"] = round(med / statistics.median(times["arena"][side]), 2)
        out[name] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", default="4MiB", help="bytes per chunk (default 4MiB)")
    parser.add_argument("--batch", type=int, default=8, help="chunks per put and get (default 8)")
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats of each path (default 15)")
    parser.add_argument("--quick", action="store_true", help="3 repeats of 2 chunks, result to a temporary file")
    add_output_flag(parser)
    args = parser.parse_args()
    chunk = parse_size(args.chunk, "--chunk")
    batch, repeats = (2, 3) if args.quick else (args.batch, args.repeats)
    daemon = start_daemon("--host-mem", str(max(256 << 20, 4 * chunk * batch)), "--disk-size", "0", tcp=False)
    try:
        times = run(daemon.ipc, chunk, batch, repeats)
    finally:
        daemon.stop()
    result = {"chunk_bytes": chunk, "batch": batch, "repeats": repeats, "paths": summary(times, chunk * batch)}
    path = write_result("inline-stream", result, quick=args.quick, out=args.out)
    print("| path | put GB/s | put × arena | get GB/s | get × arena |\n|---|---|---|---|---|")
    for name, row in result["paths"].items():
        print(f"| {name} | {row['put_gbps']} | {row['put_x_arena']} | {row['get_gbps']} | {row['get_x_arena']} |")
    print(path)


if __name__ == "__main__":
    main()
