"""``kvstore route``: choose an engine instance per request, by cached prefix first, else by bounded consistent hash.

Reads one request a line on stdin — a JSON list of token ids, or an object with a ``tokens`` list — and prints
the chosen instance's name a line (flushed at once, so a router can keep one process and talk to it through a
pipe), or with ``--json`` one object a line: instance, reason (``prefix`` or ``hash``), cached chunks, and every
instance's answer (null: none within the deadline). Every request counts as still in flight, so the load bound
spreads the whole stream; a caller that knows when requests end should use ``kvstore.routing`` instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import ConfigError
from .flag_types import positive_count


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("route", help="choose an engine instance per request (token ids as JSON lines on stdin)",
                       description="Read one request a line on stdin (a JSON list of token ids, or {\"tokens\": "
                                   "[...]}) and print the instance to send it to: the one whose daemon holds the "
                                   "longest cached prefix, else a bounded consistent hash of the prompt.")
    p.add_argument("--instance", action="append", required=True, metavar="NAME=ADDRESS",
                   help="an instance and its daemon (ipc:// or tcp://); repeat for each")
    p.add_argument("--namespace", default="default", help="the engines' key namespace (default: %(default)s)")
    p.add_argument("--chunk-tokens", type=positive_count, default=256, metavar="N",
                   help="the engines' chunk size in tokens (default: %(default)s)")
    p.add_argument("--deadline-ms", type=positive_count, default=50, metavar="MS",
                   help="how long to wait for the daemons' answers (default: %(default)s)")
    p.add_argument("--load-factor", type=float, default=1.25, metavar="C",
                   help="no instance takes more than C times its share (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object a request")
    p.set_defaults(run=run)


def parse_instances(specs: list[str]) -> dict[str, str]:
    instances: dict[str, str] = {}
    for spec in specs:
        name, sep, address = spec.partition("=")
        if not sep or not name or not address.startswith(("ipc://", "tcp://")):
            raise ConfigError(f"--instance: expected NAME=ipc://PATH or NAME=tcp://HOST:PORT, got {spec!r}")
        if name in instances:
            raise ConfigError(f"--instance: {name!r} is given twice; names must be distinct")
        instances[name] = address
    return instances


def parse_request(line: str, number: int) -> list[int]:
    try:
        data: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"stdin line {number}: not valid JSON ({exc.msg}); give a list of token ids or "
                          f'{{"tokens": [...]}}') from None
    if isinstance(data, dict):
        data = data.get("tokens")
    if not isinstance(data, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in data):
        raise ConfigError(f'stdin line {number}: expected a list of integer token ids or {{"tokens": [...]}}')
    return data


def run(args: argparse.Namespace) -> int:
    from ..routing import DaemonFleet, Router

    instances = parse_instances(args.instance)
    if args.load_factor < 1:
        raise ConfigError(f"--load-factor: must be at least 1, got {args.load_factor}")
    with DaemonFleet(instances, args.namespace, args.chunk_tokens, args.deadline_ms / 1000) as fleet:
        router = Router(list(instances), fleet.lookup, args.load_factor)
        for number, line in enumerate(sys.stdin, 1):
            if not line.strip():
                continue
            decision = router.route(fleet.chunk_keys(parse_request(line, number)))
            if args.json:
                print(json.dumps({"instance": decision.instance, "reason": decision.reason,
                                  "cached_chunks": decision.cached_chunks, "lookups": decision.lookups}), flush=True)
            else:
                print(decision.instance, flush=True)
    return 0
