"""``kvstore reload``: have a running daemon read its config file's ``[tenants]`` table again and apply it.

Does what SIGHUP to the daemon does (``kvstore/server/requests/reload.py``), and says what came of it: the tenants
now in force and the settings that changed in the file but need a restart (exit 0), or the one line that refused the
table, the old one staying in force (exit 1).
"""

from __future__ import annotations

import argparse
import json

from ..errors import KVStoreError
from .stats import add_request_flags, address_of, open_client


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reload", help="re-read the running daemon's tenants table (as SIGHUP does)",
                       description="Have a running daemon read the [tenants] table of the config file it was "
                                   "started with again, validate it as at start and apply it at once (budgets, "
                                   "access, the shared index). A bad table is refused and the old one stays in "
                                   "force (exit 1). Other settings that changed in the file are named as needing a "
                                   "restart, not applied.")
    add_request_flags(p, timeout=10.0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    client = open_client(address_of(args), args.timeout)
    try:
        report = client.reload()
    finally:
        client.close()
    if args.json:
        print(json.dumps(report))
    elif report["applied"]:
        print(f"reloaded: tenants {', '.join(report['tenants'])}")
        if report["needs_restart"]:
            print(f"changed in the file but not applied (needs a restart): {', '.join(report['needs_restart'])}")
    if not report["applied"]:
        raise KVStoreError(f"reload refused: {report['error']}; the tenants table in force is kept")
    return 0
