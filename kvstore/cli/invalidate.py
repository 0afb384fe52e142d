"""``kvstore invalidate``: have a running daemon drop every chunk of named namespaces from every tier.

The namespaces a connector says hello in name its model (``kv:MODEL`` for the format every engine reads,
``vllm:MODEL`` or ``sglang:MODEL`` for an engine's own): dropping a model's chunks after its weights changed is
``kvstore invalidate kv:MODEL vllm:MODEL sglang:MODEL``, or ``--prefix`` for every salt and layout of them.
What goes and what cannot be reached: ``kvstore/server/requests/invalidate.py``. Prints what was dropped per
namespace (exit 0); a daemon that refuses (another user's client) exits 1 with its one line.
"""

from __future__ import annotations

import argparse
import json

from .stats import add_request_flags, address_of, open_client


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("invalidate", help="drop every chunk of namespaces from every tier of a running daemon",
                       description="Have a running daemon drop every chunk of the named namespaces from DRAM, "
                                   "disk, the GPU tier and the remote store (the values it holds of them), with KV "
                                   "cache events for what was removed. Leased chunks are invisible at once and free "
                                   "their space when their leases end. Taken only from the daemon's own user (or "
                                   "root) on its host.")
    p.add_argument("namespaces", nargs="+", metavar="NAMESPACE",
                   help="a namespace to drop (a connector's names its model: kv:MODEL, or vllm:MODEL / sglang:MODEL "
                        "for an engine's own formats)")
    p.add_argument("--prefix", action="store_true",
                   help="each NAMESPACE is a prefix: drop every namespace the daemon holds that starts with it")
    add_request_flags(p, timeout=30.0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    client = open_client(address_of(args), args.timeout)
    try:
        report = client.invalidate(args.namespaces, prefix=args.prefix)
    finally:
        client.close()
    if args.json:
        print(json.dumps(report))
        return 0
    if not report["chunks"]:
        print("no namespace held matches" + (" those prefixes" if args.prefix else ""))
    for namespace, chunks in report["chunks"].items():
        print(f"{namespace}: {chunks} chunks dropped")
    if report["adopting"]:
        print(f"dropped before adoption: {report['adopting']} chunks of the kept arena")
    if report["remote_deleted"] or report["remote_failed"]:
        state = "failed (not fetched back for a while)" if report["remote_failed"] else "done"
        print(f"remote store: {report['remote_deleted']} values deleted, delete {state}")
    return 0
