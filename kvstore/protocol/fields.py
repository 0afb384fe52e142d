"""The readers of a request's fields: every field the daemon reads from the wire passes through one of them.

A header comes from an untrusted peer, so each reader checks the field's type, length and range and raises
BadRequestError (a malformed field) or LimitError (one past a bound) naming the field, before any handler sees
it. Keys come as a list of 16-byte bins or packed into one bin of 16 × n bytes; both are read here, and a
request holds at most ``MAX_BATCH`` of them. The messages (``messages.py``, ``hello.py``) are built from these.

May call the leaves only: ``errors``, ``keys`` and the wire's bounds (``wire.py``).
"""

from __future__ import annotations

from typing import Any

import math

from ..errors import BadRequestError, LimitError
from ..keys import KEY_BYTES
from .wire import MAX_BATCH


def read_int(h: dict[str, Any], name: str, lo: int, hi: int, default: int | None = None) -> int:
    value = h.get(name, default)
    if value is None:
        raise BadRequestError(f"missing field {name!r}")
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequestError(f"field {name!r} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise BadRequestError(f"field {name!r} = {value} is out of range [{lo}, {hi}]")
    return value


def read_bool(h: dict[str, Any], name: str, default: bool) -> bool:
    value = h.get(name, default)
    if not isinstance(value, bool):
        raise BadRequestError(f"field {name!r} must be a boolean, got {type(value).__name__}")
    return value


def read_float(h: dict[str, Any], name: str, lo: float, hi: float, default: float | None = None) -> float:
    """A number (int or float) in [lo, hi]; +inf passes when ``hi`` is inf, NaN never does."""
    value = h.get(name, default)
    if value is None:
        raise BadRequestError(f"missing field {name!r}")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise BadRequestError(f"field {name!r} must be a number, got {type(value).__name__}")
    if math.isnan(value) or not lo <= value <= hi:
        raise BadRequestError(f"field {name!r} = {value} is out of range [{lo}, {hi}]")
    return float(value)


def read_str(h: dict[str, Any], name: str, max_chars: int, default: str | None = None) -> str:
    value = h.get(name, default)
    if value is None:
        raise BadRequestError(f"missing field {name!r}")
    if not isinstance(value, str):
        raise BadRequestError(f"field {name!r} must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise LimitError(f"field {name!r} is {len(value)} characters long; the limit is {max_chars}")
    return value


def read_key(value: Any, name: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != KEY_BYTES:
        raise BadRequestError(f"{name} must be a {KEY_BYTES}-byte binary key")
    return value


def read_keys(h: dict[str, Any], name: str = "keys", allow_empty: bool = False) -> list[bytes]:
    """A list of 16-byte keys, sent as a list of bins or packed into one bin of 16 × n bytes."""
    value = h.get(name)
    if isinstance(value, bytes):
        return unpack_keys(value, name, allow_empty)
    if not isinstance(value, list):
        raise BadRequestError(f"field {name!r} must be a list of {KEY_BYTES}-byte keys")
    if len(value) > MAX_BATCH:
        raise LimitError(f"field {name!r} holds {len(value)} keys; the limit per request is {MAX_BATCH}")
    if not value and not allow_empty:
        raise BadRequestError(f"field {name!r} must not be empty")
    for k in value:   # the common case checked in one pass; the message names the first bad key
        if type(k) is not bytes or len(k) != KEY_BYTES:
            return [read_key(k, f"{name}[{i}]") for i, k in enumerate(value)]
    return value


def unpack_keys(packed: bytes, name: str, allow_empty: bool) -> list[bytes]:
    if len(packed) % KEY_BYTES:
        raise BadRequestError(f"field {name!r} packs keys of {KEY_BYTES} bytes; {len(packed)} bytes is not a multiple")
    count = len(packed) // KEY_BYTES
    if count > MAX_BATCH:
        raise LimitError(f"field {name!r} holds {count} keys; the limit per request is {MAX_BATCH}")
    if not count and not allow_empty:
        raise BadRequestError(f"field {name!r} must not be empty")
    return [packed[i:i + KEY_BYTES] for i in range(0, len(packed), KEY_BYTES)]


def read_sizes(h: dict[str, Any], count: int, max_size: int) -> list[int]:
    value = h.get("sizes")
    if not isinstance(value, list) or len(value) != count:
        raise BadRequestError(f"field 'sizes' must be a list of {count} integers, one per key")
    sizes = []
    for i, s in enumerate(value):
        if not isinstance(s, int) or isinstance(s, bool) or s <= 0:
            raise BadRequestError(f"sizes[{i}] must be a positive integer, got {s!r}")
        if s > max_size:
            raise LimitError(f"sizes[{i}] = {s} bytes exceeds the largest chunk this daemon stores ({max_size} bytes)")
        sizes.append(s)
    return sizes


def read_optional_key(h: dict[str, Any], name: str) -> bytes | None:
    value = h.get(name)
    return None if value is None else read_key(value, f"field {name!r}")
