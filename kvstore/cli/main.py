"""``kvstore`` — the command line: ``serve``, ``stats``, ``scrub``, ``alerts``, ``dashboard``, ``simulate``,
``route`` and the subcommands each module registers."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from .._version import __version__
from ..errors import ConfigError, KVStoreError
from . import alerts, clean, events, invalidate, keygen, reload, route, scrub, serve, simulate, stats

SUBCOMMANDS = (serve, stats, scrub, alerts, keygen, simulate, route, events, clean, reload, invalidate)


class OneLineParser(argparse.ArgumentParser):
    """Bad flags give one clear line and exit 2, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="kvstore", description="Tiered KV-cache storage daemon for LLM inference.")
    parser.add_argument("--version", action="version", version=f"kvstore {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser,
                                help="what to do (COMMAND --help for its flags)")
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def attach_negative_values(argv: Sequence[str]) -> list[str]:
    """``--flag -5MiB`` → ``--flag=-5MiB``: argparse takes a word that starts with ``-`` for a flag unless it is a
    plain number, so a negative size would get "expected one argument" instead of the size's own error."""
    out: list[str] = []
    for word in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and len(word) > 1 and word[0] == "-" \
                and word[1].isdigit():
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(attach_negative_values(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        # No command is a usage error (exit 2, as argparse's own), answered with the help rather than one line.
        parser.print_help(sys.stderr)
        return 2
    try:
        status = int(args.run(args) or 0)
        sys.stdout.flush()   # here, so that a closed pipe is caught below rather than at exit
        return status
    except BrokenPipeError:
        # The reader went away (`kvstore keygen | head -1`): stop quietly, as other Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except ConfigError as exc:
        print(f"kvstore: error: {exc}", file=sys.stderr)
        return 2
    except KVStoreError as exc:
        print(f"kvstore: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
