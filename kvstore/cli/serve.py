"""``kvstore serve``: run the daemon in the foreground, logging to stderr."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..config import add_setting_flags, build_config
from ..config_file import Origins
from ..errors import ConfigError
from ..logs import setup_logging


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the daemon (embedded defaults; no config file needed)",
                       description="Run the kvstore daemon in the foreground.")
    add_setting_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..server.lifecycle.config_checks import SERVING_CHECKS

    origins = Origins(args.config)
    config = build_config(vars(args), args.config, SERVING_CHECKS, origins)
    setup_logging(config.log_level)
    from ..server.lifecycle.daemon import run_daemon  # imported here so that `kvstore stats` starts fast

    from ..server.requests.reload import ConfigSource
    from ..tenants.table import load_tenants

    source = ConfigSource(os.path.abspath(args.config) if args.config else None, dict(vars(args)))
    try:
        status = run_daemon(config, load_tenants(args.config), source)
    except ConfigError as exc:   # a check at start (the disk tier's room, the socket) names the file's key
        raise origins.reword(exc) from None
    end_process(status)
    return status   # not reached


def end_process(status: int) -> None:
    """End a daemon that stopped cleanly without the interpreter's teardown.

    By ``stopped`` the daemon has released everything it held (sockets, arena, locks, threads: its exit stack is
    closed). What the interpreter would still do is CPU-bound bookkeeping of its own — clearing every module and
    collecting every object, several passes — which takes tens of milliseconds on an idle host and seconds on a
    loaded one, all after ``stopped``, with the service manager waiting for the process. Logs and the standard
    streams are flushed first.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass   # a closed pipe or stream: nothing left to write there
    os._exit(status)
