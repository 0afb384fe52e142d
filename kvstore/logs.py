"""Logging: one line per event, ``key=value`` pairs, to stderr — easy to grep and to ship."""

from __future__ import annotations

import logging
import sys
from typing import Any

_LOGGER = logging.getLogger("kvstore")


def _quote(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def format_event(event: str, fields: dict[str, Any]) -> str:
    return " ".join([f"event={event}"] + [f"{k}={_quote(v)}" for k, v in fields.items()])


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ts=%(asctime)s level=%(levelname)s %(message)s"))
    _LOGGER.handlers[:] = [handler]
    _LOGGER.setLevel(level.upper())
    _LOGGER.propagate = False


def log(event: str, level: int = logging.INFO, **fields: Any) -> None:
    if _LOGGER.isEnabledFor(level):
        _LOGGER.log(level, format_event(event, fields))


def debug(event: str, **fields: Any) -> None:
    log(event, logging.DEBUG, **fields)


def info(event: str, **fields: Any) -> None:
    log(event, logging.INFO, **fields)


def warning(event: str, **fields: Any) -> None:
    log(event, logging.WARNING, **fields)


def error(event: str, **fields: Any) -> None:
    log(event, logging.ERROR, **fields)
