"""``kvstore serve``: run the daemon in the foreground, logging to stderr."""

from __future__ import annotations

import argparse

from ..config import add_setting_flags, build_config
from ..logs import setup_logging


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the daemon (embedded defaults; no config file needed)",
                       description="Run the kvstore daemon in the foreground.")
    add_setting_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = build_config(vars(args), args.config)
    setup_logging(config.log_level)
    from ..server.daemon import run_daemon  # imported here so that `kvstore stats` starts fast

    return run_daemon(config)
