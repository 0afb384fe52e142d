"""A request's retention class: whether the connector may save what the request computes, and how the daemon
keeps what it saves.

A request asks for one through its ``kv_transfer_params`` (vLLM hands the connector
``SamplingParams.extra_args["kv_transfer_params"]``; the OpenAI server fills it from the request body's
``kv_transfer_params``), field ``kvstore_retention``:

- ``pin``: saved chunks are soft-pinned in the daemon's DRAM for ``kvstore_pin_ttl`` seconds (a number in the
  same ``kv_transfer_params``; absent: the daemon's ``--pin-ttl``), bounded by the daemon (past the bound: ``high``);
- ``high``: saved chunks are evicted only after ``normal`` and ``low`` ones;
- ``normal`` (the default): loads and saves as configured;
- ``low``: saved chunks are evicted first;
- ``no-store``: loads still happen, but nothing the request computes is saved.

Without the field, the request's scheduling ``priority`` (vLLM's: lower is more important) picks the class through
the connector's optional ``priority_retention`` table (``config.py``): each key is the highest priority that gets
its class, the smallest key at or above the request's priority wins, and a priority above every key is
``normal``. Without the table priority plays no part.

An unknown value (class or TTL) is ignored (the request runs as ``normal``, or with the daemon's TTL) with one
warning line naming it: never an error.
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

log = logging.getLogger("kvstore.connectors.vllm")

RETENTION_FIELD = "kvstore_retention"
PIN_TTL_FIELD = "kvstore_pin_ttl"


class Retention(str, Enum):
    """What the connector keeps of one request's KV, and how the daemon keeps it (most kept first)."""

    PIN = "pin"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"
    NO_STORE = "no-store"

    @property
    def saves(self) -> bool:
        """Whether the request's computed chunks may be saved."""
        return self is not Retention.NO_STORE


ALLOWED = ", ".join(r.value for r in Retention)


@dataclass(frozen=True)
class RequestRetention:
    """One request's class and, for ``pin``, its TTL in seconds (None: the daemon's default)."""

    cls: Retention = Retention.NORMAL
    pin_ttl: float | None = None


def retention_of(kv_transfer_params: Any, req_id: str = "", priority: int | None = None,
                 by_priority: Sequence[tuple[int, Retention]] = ()) -> Retention:
    """The retention class asked for in a request's ``kv_transfer_params`` or, without the field, the one
    ``by_priority`` (sorted by priority) gives its ``priority``; ``normal`` otherwise. A value that is not one of
    `Retention`'s is ignored with a warning: never an error."""
    if not isinstance(kv_transfer_params, dict) or RETENTION_FIELD not in kv_transfer_params:
        return _by_priority(priority, by_priority)
    value = kv_transfer_params[RETENTION_FIELD]
    try:
        return Retention(value)
    except (ValueError, TypeError):  # TypeError: an unhashable value
        log.warning("kvstore: request %s asks for %s=%r, which is not one of %s: ignored (the request runs as %r)",
                    req_id or "?", RETENTION_FIELD, value, ALLOWED, Retention.NORMAL.value)
        return Retention.NORMAL


def _by_priority(priority: int | None, by_priority: Sequence[tuple[int, Retention]]) -> Retention:
    if not by_priority or not isinstance(priority, int):
        return Retention.NORMAL
    at = bisect.bisect_left([p for p, _ in by_priority], priority)
    return by_priority[at][1] if at < len(by_priority) else Retention.NORMAL


def pin_ttl_of(kv_transfer_params: Any, req_id: str = "") -> float | None:
    """The ``kvstore_pin_ttl`` seconds a request asks for (None: absent, or not a positive number, warned)."""
    if not isinstance(kv_transfer_params, dict) or PIN_TTL_FIELD not in kv_transfer_params:
        return None
    value = kv_transfer_params[PIN_TTL_FIELD]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        log.warning("kvstore: request %s asks for %s=%r, which is not a positive number of seconds: ignored (the "
                    "daemon's --pin-ttl applies)", req_id or "?", PIN_TTL_FIELD, value)
        return None
    return float(value)


def request_retention(kv_transfer_params: Any, req_id: str = "", priority: int | None = None,
                      by_priority: Sequence[tuple[int, Retention]] = ()) -> RequestRetention:
    """A request's class (``retention_of``) and, when it is ``pin``, its TTL (``pin_ttl_of``)."""
    cls = retention_of(kv_transfer_params, req_id, priority, by_priority)
    return RequestRetention(cls, pin_ttl_of(kv_transfer_params, req_id) if cls is Retention.PIN else None)
