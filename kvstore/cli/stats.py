"""``kvstore stats``: what a running daemon holds, as a table or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..defaults import default_socket
from ..errors import ConfigError, DaemonUnavailable
from ..units import format_size
from .flag_types import any_count, positive_seconds


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help="show what a running daemon holds",
                       description="Show a running daemon's tiers (capacity, use, chunks), hit rate, leases and "
                                   "clients, as a table, as JSON, or refreshed in place with rates (--watch).")
    p.add_argument("--socket", default=None, metavar="PATH",
                   help="the daemon's socket (default: the one `kvstore serve` uses)")
    p.add_argument("--address", default=None, metavar="URL",
                   help="ipc:///path or tcp://HOST:PORT instead of --socket (CURVE keys from KVSTORE_CURVE_*)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout", type=positive_seconds, default=2.0, metavar="SECONDS",
                   help="how long to wait for the daemon's answer (default: %(default)s)")
    p.add_argument("--watch", action="store_true", help="refresh in place with rates until interrupted")
    p.add_argument("--interval", type=positive_seconds, default=None, metavar="SECONDS",
                   help="--watch refresh period (default: 1)")
    p.add_argument("--count", type=any_count, default=None, metavar="N",
                   help="--watch: stop after N refreshes (0: never)")
    p.set_defaults(run=run)


def add_request_flags(p: argparse.ArgumentParser, timeout: float) -> None:
    """The flags of a command that sends the daemon one request: where it is (--socket, --address), how long
    its answer may take (--timeout, default `timeout` seconds) and --json for the answer as one JSON object."""
    p.add_argument("--socket", default=None, metavar="PATH", help="the daemon's socket (default: its default)")
    p.add_argument("--address", default=None, metavar="URL", help="ipc:// address instead of --socket")
    p.add_argument("--timeout", type=positive_seconds, default=timeout, metavar="SECONDS",
                   help=f"how long to wait for the daemon's answer (default: {timeout:g})")
    p.add_argument("--json", action="store_true", help="print the daemon's answer as one JSON object")


def address_of(args: argparse.Namespace) -> str:
    if args.address and args.socket:
        raise ConfigError("--address and --socket name the same thing; give one")
    if args.address is None:
        return "ipc://" + (args.socket or default_socket())
    if not args.address.startswith(("ipc://", "tcp://")):
        hint = f"; for a socket path use --socket {args.address}" if "://" not in args.address else ""
        raise ConfigError(f"--address: expected ipc:///path/to/kvstore.sock or tcp://HOST:PORT, "
                          f"got {args.address!r}{hint}")
    return args.address


def open_client(address: str, timeout: float) -> Any:
    from ..client.client import Client
    from ..errors import UsageError

    try:
        return Client(address, namespace="kvstore-cli", timeout=timeout, use_arena=False)
    except UsageError as exc:
        flag = "--socket" if address.startswith("ipc://") else "--address"
        raise ConfigError(f"{flag}: {exc}") from None


def fetch_stats(address: str, timeout: float) -> dict[str, Any]:
    client = open_client(address, timeout)
    try:
        return client.stats()
    finally:
        client.close()


def check_watch_flags(args: argparse.Namespace) -> None:
    """``--interval`` and ``--count`` shape ``--watch``; given without it they would be silently ignored."""
    given = [flag for flag, value in (("--interval", args.interval), ("--count", args.count)) if value is not None]
    if given and not args.watch:
        raise ConfigError(f"{given[0]} only applies with --watch; add --watch, or drop {given[0]}")
    if args.watch and args.json:
        raise ConfigError("--json prints one snapshot and --watch a live view; give one of them")


def run_watch(args: argparse.Namespace) -> int:
    from .watch import watch

    address = address_of(args)
    client = open_client(address, args.timeout)
    try:
        return watch(client, address, args.interval or 1.0, args.count or 0)
    finally:
        client.close()


def adoption_text(report: dict[str, Any]) -> str:
    """One line on what this start adopted of the DRAM tier its predecessor left (``store/adoption.py``)."""
    if report["state"] not in ("verifying", "done"):
        return f"{report['state']}: {report['reason']}" if report.get("reason") else report["state"]
    text = (f"{report['state']} (from the {report.get('source') or 'description'}): {report['adopted_chunks']} "
            f"adopted ({format_size(report['adopted_bytes'])}), {report['verified_chunks']} of "
            f"{report['listed_chunks'] - report['unfit_chunks']} verified, {report['corrupt_chunks']} corrupt, "
            f"{report['dropped_chunks']} dropped")
    return text + (f" in {report['seconds']:.2f}s" if report["state"] == "done" else "")


def render_table(stats: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from .watch import other_clients, percent, print_whole

    console = Console()
    tiers = Table(title=f"kvstore {stats.get('version', '')} — up {stats.get('uptime_s', 0):.0f}s")
    for col in ("tier", "capacity", "used", "use %", "chunks"):
        tiers.add_column(col, justify="right" if col != "tier" else "left")
    for name, t in stats["tiers"].items():
        cap = t["capacity_bytes"]
        tiers.add_row(name, format_size(cap), format_size(t["used_bytes"]), percent(t["used_bytes"], cap),
                      str(t["chunks"]))
    print_whole(console, tiers)
    c = stats["counters"]
    asked, hit = stats["lookup_tokens"], stats["hit_tokens"]
    rate = percent(hit, asked)
    summary = Table(show_header=False)
    for label, value in (("hit tokens", hit), ("miss tokens", asked - hit), ("token hit rate", rate),
                         ("evictions", c["evictions"]), ("active leases", stats["leases"]),
                         ("reservations", stats["reservations"]), ("clients", other_clients(stats)),
                         ("native paths", stats.get("native", "-"))):
        summary.add_row(label, str(value))
    from .watch import Sample, integrity_rows

    for label, text, bad in integrity_rows(Sample.of(stats)):
        summary.add_row(label, f"[red]{text}[/red]" if bad else text)
    remote = stats.get("remote")
    if remote:
        state = "up" if remote["up"] else "down"
        summary.add_row("remote store", f"{state}, {remote['lookup_chunks']} chunks found, {remote['puts']} sent, "
                                        f"{remote['put_dropped']} dropped, {remote['outages']} outages")
    adoption = stats.get("adoption")
    if adoption:
        summary.add_row("warm restart", adoption_text(adoption))
    print_whole(console, summary)
    from .watch import tenant_table

    tenants = tenant_table(stats)
    if tenants is not None:
        print_whole(console, tenants)
    connectors = stats.get("connector_list") or []
    if connectors:
        table = Table(title="engine connectors")
        for col in ("engine", "model family", "state", "why", "client"):
            table.add_column(col)
        for c in connectors:
            table.add_row(c["engine"], c["family"], c["state"], c["reason"], c["client_id"])
        print_whole(console, table)


def run(args: argparse.Namespace) -> int:
    check_watch_flags(args)
    try:
        if args.watch:
            return run_watch(args)
        stats = fetch_stats(address_of(args), args.timeout)
    except DaemonUnavailable as exc:
        print(f"kvstore: error: {exc}", file=sys.stderr)
        return 1
    show(stats, args.json, render_table)
    return 0


def show(result: dict[str, Any], as_json: bool, render: Any) -> None:
    """One JSON object, or ``render``'s table."""
    if as_json:
        print(json.dumps(result, sort_keys=True))
    else:
        render(result)
