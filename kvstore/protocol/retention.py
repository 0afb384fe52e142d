"""Retention classes: what a put asks the daemon to do with its chunks under pressure.

A put (RESERVE, PUT_INLINE, CREDIT_PUT) may carry ``"retention": NAME`` and, with ``pin``, ``"pin_ttl": SECONDS``;
neither field is sent for ``normal``, so a put that asks nothing costs nothing. The classes, from the first to go:

- ``low``: evicted before any ``normal`` chunk of the same pool;
- ``normal`` (the default): today's policy order;
- ``high``: evicted only once no ``low`` or ``normal`` chunk can make the room;
- ``pin``: a soft pin, never evicted until its TTL ends (then it is ``high``); bounded per tenant and daemon-wide,
  a pin over the bound is stored as ``high`` (``store/retention.py``);
- ``no-store``: the daemon acknowledges the put and stores nothing.

Inside each class the eviction policy's order holds. The order of the enum is the eviction order (append-only on
the wire: the names are what travel, never the numbers).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from ..errors import BadRequestError

MAX_WIRE_PIN_TTL = 1e9   # a bound on what the wire may say; the daemon cuts a TTL to its --max-pin-ttl


class Retention(enum.IntEnum):
    """The classes a stored chunk may have, lowest (first evicted) first."""

    LOW = 0
    NORMAL = 1
    HIGH = 2
    PIN = 3


NO_STORE = "no-store"
BY_NAME = {"low": Retention.LOW, "normal": Retention.NORMAL, "high": Retention.HIGH, "pin": Retention.PIN}
NAMES = ("pin", "high", "normal", "low", NO_STORE)   # as documented, most kept first
ALLOWED = ", ".join(NAMES)


@dataclass(frozen=True)
class RetentionAsk:
    """What one put asks for: a class (None: ``no-store``) and, for ``pin``, its TTL (None: the daemon's default)."""

    cls: Retention | None = Retention.NORMAL
    pin_ttl: float | None = None

    @property
    def stores(self) -> bool:
        return self.cls is not None

    @property
    def name(self) -> str:
        return NO_STORE if self.cls is None else self.cls.name.lower()


NORMAL = RetentionAsk()


def parse_retention(name: Any, pin_ttl: Any = None, where: str = "retention") -> RetentionAsk:
    """``name`` and ``pin_ttl`` checked; ValueError with one line naming what is wrong and what is allowed."""
    if not isinstance(name, str) or (name not in BY_NAME and name != NO_STORE):
        raise ValueError(f"{where} {name!r} is not a retention class; use one of {ALLOWED}")
    if pin_ttl is not None:
        if name != "pin":
            raise ValueError(f"pin_ttl is given with retention {name!r}; it applies to 'pin' only")
        if isinstance(pin_ttl, bool) or not isinstance(pin_ttl, (int, float)) or math.isnan(pin_ttl) \
                or not 0 < pin_ttl <= MAX_WIRE_PIN_TTL:
            raise ValueError(f"pin_ttl {pin_ttl!r} must be a number of seconds in (0, {MAX_WIRE_PIN_TTL:.0f}]")
        pin_ttl = float(pin_ttl)
    if name == NO_STORE:
        return RetentionAsk(None)
    cls = BY_NAME[name]
    return NORMAL if cls is Retention.NORMAL else RetentionAsk(cls, pin_ttl)


def read_retention(h: dict[str, Any]) -> RetentionAsk:
    """The ``retention`` and ``pin_ttl`` fields of a put's header (absent: ``normal``); BadRequestError when bad."""
    name = h.get("retention")
    ttl = h.get("pin_ttl")
    if name is None and ttl is None:
        return NORMAL
    try:
        return parse_retention("normal" if name is None else name, ttl, "field 'retention' =")
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None


def wire_retention(ask: RetentionAsk) -> dict[str, Any]:
    """The header fields that carry ``ask`` (none for ``normal``)."""
    if ask.cls is Retention.NORMAL:
        return {}
    fields: dict[str, Any] = {"retention": ask.name}
    if ask.pin_ttl is not None:
        fields["pin_ttl"] = ask.pin_ttl
    return fields
