"""What a restricted tenant's key space costs: a lookup of its stored chunks against an open namespace's.

    python -m bench.key_space [--lookups 2000] [--chain 8] [--quick] [--out FILE]

A daemon with a tenants table: tenant ``team`` owns ``team:`` and lists our uid (restricted: its keys are mapped
into its key space at the dispatcher, ``kvstore/tenants/key_space.py``); every other namespace is open (raw keys).
Each namespace stores a chain of ``--chain`` chunks; two local clients on the stream socket, neither using the
shared index (every lookup goes to the daemon), look their chain up ``--lookups`` times each, interleaved (which
goes first alternates). Reported: p10/p50/p90 of each in microseconds and the ratio of the medians; and, in
process, the cost of mapping one request's keys (``scope_request`` of a LOOKUP of ``--chain`` keys).
Writes bench/results/key-space-latest.json (``--quick``: a temporary file) and prints a Markdown table.
"""

from __future__ import annotations

import os
import statistics
import time
import timeit

import kvstore
from bench._common import write_result
from bench.tenant_timing import lookup_args, percentiles, tenants_daemon
from kvstore.protocol.wire import Op
from kvstore.tenants.key_space import KeySpace, scope_request

TABLE = f'[tenants.team]\nnamespaces = ["team:"]\nuids = [{os.getuid()}]\n'


def interleaved(clients: list[kvstore.Client], chains: list[list[bytes]], lookups: int) -> list[list[float]]:
    """``lookups`` timings of each client's lookup of its chain, alternating which client goes first."""
    times: list[list[float]] = [[] for _ in clients]
    for i in range(lookups):
        for which in ((0, 1) if i % 2 else (1, 0)):
            t0 = time.perf_counter()
            found = clients[which].lookup(chains[which])
            times[which].append(time.perf_counter() - t0)
            assert found == len(chains[which]), "a stored chain was not found"
    return times


def scope_us(chain: int, repeat: int = 2000) -> float:
    """Microseconds to map the keys of one LOOKUP of ``chain`` keys (median of 5 runs of ``repeat``)."""
    space = KeySpace(os.urandom(32), "team")
    header = {"op": int(Op.LOOKUP), "id": 1, "keys": b"".join(os.urandom(16) for _ in range(chain))}
    runs = timeit.repeat(lambda: scope_request(space, Op.LOOKUP, header), number=repeat, repeat=5)
    return round(statistics.median(runs) / repeat * 1e6, 2)


def main() -> None:
    args = lookup_args(__doc__.splitlines()[0])
    lookups = args.lookups
    daemon, _config = tenants_daemon(TABLE, "ks-")
    try:
        chains = [[os.urandom(16) for _ in range(args.chain)] for _ in range(2)]
        with kvstore.connect(daemon.ipc, namespace="team:a", timeout=30, shared_index=False) as team, \
                kvstore.connect(daemon.ipc, namespace="open:a", timeout=30, shared_index=False) as anyone:
            clients = [team, anyone]
            for client, keys in zip(clients, chains):
                client.put(keys, [b"k" * 4096] * args.chain)
            interleaved(clients, chains, 50)   # warm-up
            restricted, open_ = interleaved(clients, chains, lookups)
    finally:
        daemon.stop()
    result = {"lookups": lookups, "chain": args.chain, "restricted_us": percentiles(restricted),
              "open_us": percentiles(open_),
              "median_ratio": round(statistics.median(restricted) / statistics.median(open_), 3),
              "scope_request_us": scope_us(args.chain)}
    path = write_result("key-space", result, quick=args.quick, out=args.out)
    print("| lookup of a stored chain | p10 µs | p50 µs | p90 µs |\n|---|---|---|---|")
    for name in ("restricted", "open"):
        row = result[f"{name}_us"]
        print(f"| {name} | {row['p10']} | {row['p50']} | {row['p90']} |")
    print(f"median ratio restricted/open: {result['median_ratio']}; mapping one LOOKUP's {args.chain} keys: "
          f"{result['scope_request_us']} µs  ({path})")


if __name__ == "__main__":
    main()
