"""``kvstore clean``: free the shared-memory files no daemon serves from (``tiers/host/leftovers.py``)."""

from __future__ import annotations

import argparse
import os

from ..units import format_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("clean", help="free kept or orphaned arenas and indexes in /dev/shm",
                       description="Free this user's kvstore files in /dev/shm that no process maps: the arena a "
                                   "cleanly stopped daemon kept for a warm restart (with its description), and "
                                   "the arena, journal and index a killed daemon left (the next start on its "
                                   "socket would adopt them). A file some process maps, or a kept arena whose "
                                   "socket a daemon holds, is never removed.")
    p.add_argument("--socket", default=None, metavar="PATH",
                   help="only the files of the daemon on this socket (default: every daemon of this user)")
    p.add_argument("--dry-run", action="store_true", help="list what would be freed, free nothing")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..tiers.host.arena import arena_path_for
    from ..tiers.host.leftovers import find_leftovers, remove

    found = find_leftovers()
    if args.socket:
        stem = arena_path_for(os.path.abspath(args.socket)).removesuffix(".arena")
        found = [f for f in found if f.path.startswith(stem + ".")]
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
        print("nothing to clean")
    elif not args.dry_run:
        print(f"freed {format_size(freed)}; {held} file(s) in use kept")
    return 0
