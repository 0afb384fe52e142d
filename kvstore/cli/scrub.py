"""``kvstore scrub``: have a running daemon check every copy of every chunk now, and print what it found.

The daemon does the pass (it owns the tiers and their slots; see ``kvstore/store/scrub.py``): each copy is
checked against the chunk's checksum, a damaged one is repaired from an intact copy or dropped with the chunks
that continue it. The counts are per tier: ``checked``, ``corrupt``, ``dropped`` (chunks that left the index).
``--rate`` bounds the bytes checked per second, to leave memory and disk bandwidth to the engines. Exit code 0
when nothing was damaged, 3 when something was (so a cron job or a health check can tell), 1 when no daemon
answered.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import DaemonUnavailable
from ..units import format_size, parse_size
from .stats import positive_seconds, address_of, open_client, show

EXIT_DAMAGED = 3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scrub", help="check every chunk in every tier of a running daemon now",
                       description="Have a running daemon check every copy of every chunk against its checksum "
                                   "now, repair or drop what is damaged, and print the counts per tier (exit 3 "
                                   "if anything was damaged).")
    p.add_argument("--socket", default=None, metavar="PATH", help="the daemon's socket (default: its default)")
    p.add_argument("--address", default=None, metavar="URL", help="ipc:// or tcp:// address instead of --socket")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--rate", type=_rate, default=0, metavar="BYTES/s",
                   help="check at most this many bytes per second, e.g. 500MiB (default: no bound)")
    p.add_argument("--timeout", type=positive_seconds, default=3600.0, metavar="SECONDS",
                   help="how long to wait for the pass")
    p.set_defaults(run=run)


def _rate(text: str) -> int:
    try:
        return parse_size(text.removesuffix("/s"), "--rate")
    except Exception as exc:  # noqa: BLE001 - one line for argparse
        raise argparse.ArgumentTypeError(str(exc)) from None


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kvstore scrub — {report['seconds']:.2f}s")
    for col in ("tier", "checked", "corrupt", "dropped", "bytes"):
        table.add_column(col, justify="left" if col == "tier" else "right")
    for name, t in report["tiers"].items():
        table.add_row(name, str(t["checked"]), str(t["corrupt"]), str(t["dropped"]), format_size(t["bytes"]))
    table.add_row("all", str(report["checked"]), str(report["corrupt"]), str(report["dropped"]),
                  format_size(report["bytes"]))
    Console().print(table)


def run(args: argparse.Namespace) -> int:
    address = address_of(args)
    try:
        client = open_client(address, 5.0)
        try:
            report = client.scrub(args.rate, timeout=args.timeout)
        finally:
            client.close()
    except DaemonUnavailable as exc:
        print(f"kvstore: error: {exc}", file=sys.stderr)
        return 1
    show(report, args.json, render)
    return EXIT_DAMAGED if report["corrupt"] else 0
