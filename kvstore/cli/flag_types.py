"""The argparse types of the commands' flags, made from the parsers of ``kvstore/units.py``: each kind of value
(seconds, a count, a size) is checked, and its error worded, in one place for every command.

argparse names the flag (``argument --timeout: must be positive, got '0'``), so the parser's own ``what: `` prefix
is left out of the message.
"""

from __future__ import annotations

import argparse
from typing import Callable, TypeVar

from ..errors import ConfigError
from ..units import parse_count, parse_seconds, parse_size

T = TypeVar("T")


def flag_type(parse: Callable[[str, str], T], what: str) -> Callable[[str], T]:
    """An argparse ``type=`` from ``parse(text, what)``, whose ConfigError becomes argparse's one-line error."""
    def read(text: str) -> T:
        try:
            return parse(text, what)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{what}: ")) from None

    read.__name__ = what   # what argparse calls the value in its own errors
    return read


positive_seconds = flag_type(parse_seconds, "seconds")       # 30s, 500ms, 2m or a number of seconds, above 0
positive_count = flag_type(parse_count, "count")             # a whole number, 1 or more
any_count = flag_type(lambda text, what: parse_count(text, what, minimum=0), "count")   # 0 or more
bytes_per_second = flag_type(lambda text, what: parse_size(text.removesuffix("/s"), what), "rate")   # 500MiB/s
