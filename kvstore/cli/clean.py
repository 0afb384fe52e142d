"""``kvstore clean``: free the shared-memory files no daemon serves from (``tiers/host/leftovers.py``)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ..defaults import default_socket
from ..errors import ConfigError
from ..units import format_size

if TYPE_CHECKING:
    from ..tiers.host.leftovers import Leftover


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("clean", help="free kept or orphaned arenas and indexes in /dev/shm",
                       description="Free this user's kvstore files in /dev/shm that no process maps: the arena a "
                                   "cleanly stopped daemon kept for a warm restart (with its description), and "
                                   "the arena, journal and index a killed daemon left (the next start on its "
                                   "socket would adopt them), of the daemon on the default socket, on --socket, "
                                   "or (--all) on every socket. A file some process maps, or a kept arena whose "
                                   "socket a daemon holds, is never removed.")
    p.add_argument("--socket", default=None, metavar="PATH",
                   help="the files of the daemon on this socket (default: the one `kvstore serve` uses)")
    p.add_argument("--all", action="store_true",
                   help="the files of every daemon of this user, on any socket (another daemon's warm restart too)")
    p.add_argument("--dry-run", action="store_true", help="list what would be freed, free nothing")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..tiers.host.leftovers import find_leftovers, remove

    if args.all and args.socket:
        raise ConfigError("--all frees the files of every socket and --socket those of one; give one of them")
    found = find_leftovers()
    if not args.all:
        found = of_socket(found, args.socket or default_socket())
    freed = held = 0
    for f in found:
        what = f"{f.path} ({f.kind}, {format_size(f.nbytes)}{', socket ' + f.socket if f.socket else ''})"
        if not f.removable:
            reason = "mapped by a running process" if f.mapped else "its daemon is running"
            print(f"kept  {what}: {reason}")
            held += 1
        elif args.dry_run:
            print(f"would free  {what}")
        elif remove(f):
            print(f"freed {what}")
            freed += f.nbytes
    if not found:
        print("nothing to clean" + ("" if args.all else " for this socket (--all: for every socket)"))
    elif not args.dry_run:
        print(f"freed {format_size(freed)}; {held} file(s) in use kept")
    return 0


def of_socket(found: list["Leftover"], socket: str) -> list["Leftover"]:
    """The files in ``found`` that belong to the daemon on ``socket`` (their names derive from its path)."""
    from ..mapped.arena import arena_path_for

    stem = arena_path_for(os.path.abspath(socket)).removesuffix(".arena")
    return [f for f in found if f.path.startswith(stem + ".")]
