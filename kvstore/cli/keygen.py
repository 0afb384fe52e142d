"""``kvstore keygen``: make a CURVE key pair (owner-only files) for the daemon or for one client."""

from __future__ import annotations

import argparse
import os

from ..defaults import default_runtime_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keygen", help="make a CURVE key pair for --tcp authentication",
                       description="Write NAME.key (public: give it to the other side) and NAME.key_secret "
                                   "(keep it here), both mode 0600. The daemon takes server.key_secret as "
                                   "--curve-server-key and a directory of client .key files as "
                                   "--curve-client-keys; a client takes the daemon's server.key and its own "
                                   ".key_secret (KVSTORE_CURVE_SERVER_KEY, KVSTORE_CURVE_CLIENT_KEY).")
    p.add_argument("--dir", default=None, metavar="DIR",
                   help="where to write the files (default: $XDG_RUNTIME_DIR/kvstore/curve or "
                        "/tmp/kvstore-$UID/curve; every level it creates is 0700)")
    p.add_argument("--name", default="server", metavar="NAME", help="file name stem (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace existing files of that name")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..security.keys import generate_keypair

    directory = args.dir or os.path.join(default_runtime_dir(), "curve")
    public, secret = generate_keypair(directory, args.name, args.force)
    print(f"public key: {public}\nsecret key: {secret}")
    return 0
