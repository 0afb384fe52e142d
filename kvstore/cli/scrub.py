"""``kvstore scrub``: have a running daemon check every copy of every chunk now, and print what it found.

The daemon does the pass (it owns the tiers and their slots; see ``kvstore/store/scrub.py``): each copy is
checked against the chunk's checksum, a damaged one is repaired from an intact copy or dropped with the chunks
that continue it. The counts are per tier: ``checked``, ``corrupt``, ``dropped`` (chunks that left the index).
``--rate`` bounds the bytes checked per second, to leave memory and disk bandwidth to the engines.

The pass belongs to this command (``kvstore/client/scrub_pass.py``): while it runs, a progress line on stderr
says what has been checked, at what rate and how long is left; Ctrl-C, SIGTERM or ``--timeout`` stop it in the
daemon too, and a command killed outright has its pass stopped by the daemon seconds later. ``--cancel`` stops
every pass clients started. Exit code 0 when nothing was damaged, 3 when something was (so a cron job or a health
check can tell), 1 when no daemon answered or the pass was stopped before it checked everything.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from ..errors import ConfigError, DaemonUnavailable
from ..units import format_size
from .flag_types import bytes_per_second, positive_seconds
from .stats import address_of, open_client, show

EXIT_DAMAGED = 3
EXIT_STOPPED = 1
PROGRESS_EVERY_S = 10.0   # into a file or a pipe: a progress line this often (a terminal: every refresh)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scrub", help="check every chunk in every tier of a running daemon now",
                       description="Have a running daemon check every copy of every chunk against its checksum "
                                   "now, repair or drop what is damaged, and print the counts per tier (exit 3 "
                                   "if anything was damaged). Progress goes to stderr; Ctrl-C stops the pass.")
    p.add_argument("--socket", default=None, metavar="PATH", help="the daemon's socket (default: its default)")
    p.add_argument("--address", default=None, metavar="URL", help="ipc:// or tcp:// address instead of --socket")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--rate", type=bytes_per_second, default=0, metavar="BYTES/s",
                   help="check at most this many bytes per second, e.g. 500MiB (default: no bound)")
    p.add_argument("--timeout", type=positive_seconds, default=None, metavar="SECONDS",
                   help="stop the pass if it has not finished after this long (default: let it finish)")
    p.add_argument("--cancel", action="store_true", help="stop every scrub pass clients started, and exit")
    p.set_defaults(run=run)


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    stopped = " (stopped before the end)" if report.get("cancelled") else ""
    table = Table(title=f"kvstore scrub — {report['seconds']:.2f}s{stopped}")
    for col in ("tier", "checked", "corrupt", "dropped", "bytes"):
        table.add_column(col, justify="left" if col == "tier" else "right")
    for name, t in report["tiers"].items():
        table.add_row(name, str(t["checked"]), str(t["corrupt"]), str(t["dropped"]), format_size(t["bytes"]))
    table.add_row("all", str(report["checked"]), str(report["corrupt"]), str(report["dropped"]),
                  format_size(report["bytes"]))
    Console().print(table)


def progress_line(p: dict[str, Any]) -> str:
    """``scrub: 3 of 40 chunks, 12.0 KiB of 160.0 KiB, 1.0 KiB/s, about 2m28s left``."""
    eta = p.get("eta_s")
    left = f"about {_duration(eta)} left" if eta is not None else "time left not known yet"
    return (f"scrub: {p['chunks_done']} of {p['chunks_total']} chunks, {format_size(p['bytes_done'])} of "
            f"{format_size(p['bytes_total'])}, {format_size(p['rate'])}/s, {left}")


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class ProgressShown:
    """The progress line on stderr: rewritten in place on a terminal, a line every PROGRESS_EVERY_S otherwise."""

    def __init__(self) -> None:
        self.terminal = sys.stderr.isatty()
        self.last = 0.0
        self.drawn = False

    def __call__(self, p: dict[str, Any]) -> None:
        now = time.monotonic()
        if self.terminal:
            sys.stderr.write("\r\x1b[2K" + progress_line(p))
            self.drawn = True
        elif not self.last or now - self.last >= PROGRESS_EVERY_S:
            sys.stderr.write(progress_line(p) + "\n")
            self.last = now
        sys.stderr.flush()

    def end(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()


class Terminated(Exception):
    """SIGTERM: stop the pass as Ctrl-C would."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def run(args: argparse.Namespace) -> int:
    address = address_of(args)
    if args.cancel and (args.rate or args.timeout is not None):
        raise ConfigError("--cancel stops passes and starts none; drop --rate and --timeout")
    shown = ProgressShown()
    began = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        client = open_client(address, 5.0)
        try:
            if args.cancel:
                return _cancel(client)
            report = client.scrub(args.rate, timeout=args.timeout, progress=shown)
        finally:
            shown.end()
            client.close()
    except DaemonUnavailable as exc:
        print(f"kvstore: error: {exc}", file=sys.stderr)
        return 1
    except Terminated:
        print("kvstore: scrub stopped (SIGTERM); the daemon stopped the pass", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("kvstore: scrub stopped (interrupted); the daemon stopped the pass", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    show(report, args.json, render)
    if report["corrupt"]:
        return EXIT_DAMAGED
    if report.get("cancelled"):
        print(f"kvstore: error: {_why_stopped(args, time.monotonic() - began, report['checked'])}", file=sys.stderr)
        return EXIT_STOPPED
    return 0


def _why_stopped(args: argparse.Namespace, elapsed: float, checked: int) -> str:
    if args.timeout is not None and elapsed >= args.timeout:
        return (f"the scrub was stopped at --timeout {args.timeout:g}s, {checked} chunk copies checked; raise "
                f"--timeout or --rate, or leave --timeout out")
    return f"the scrub was stopped by kvstore scrub --cancel or a stopping daemon, {checked} chunk copies checked"


def _cancel(client: Any) -> int:
    stopped = client.scrub_cancel()
    print(f"stopped {stopped} scrub pass{'es' if stopped != 1 else ''}" if stopped else
          "no scrub pass started by a client was running")
    return 0
