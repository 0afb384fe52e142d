"""Parsing and printing of byte sizes and durations as operators write them (``512MiB``, ``4GiB``, ``30s``)."""

from __future__ import annotations

import re

from .errors import ConfigError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "p": 1000**5, "pb": 1000**5,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int, what: str = "size") -> int:
    """``"512MiB"`` → 536870912. Integers are bytes. Raises ConfigError naming ``what``."""
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a size such as 512MiB or 4GiB, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"{what}: size must not be negative, got {text}")
        return text
    if not isinstance(text, str):
        raise ConfigError(f"{what}: expected a size such as 512MiB or 4GiB, got {text!r}")
    if text.strip().startswith("-"):
        raise ConfigError(f"{what}: a size must not be negative, got {text!r}; write e.g. 512MiB or 4GiB")
    m = _SIZE_RE.match(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _SIZE_UNITS:
        raise ConfigError(f"{what}: cannot read {text!r} as a size; write e.g. 512MiB, 4GiB or 1000000 (bytes)")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def format_size(n: int | float) -> str:
    """Bytes → the shortest binary-unit string (``1.5 GiB``)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_seconds(text: str | int | float, what: str = "duration") -> float:
    """``"30s"``, ``"500ms"``, ``"2m"`` or a number of seconds → seconds."""
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a duration such as 30s or 500ms, got {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|)\s*$", str(text))
        if m is None:
            raise ConfigError(f"{what}: cannot read {text!r} as a duration; write e.g. 30s, 500ms or 2m")
        value = float(m.group(1)) * {"ms": 0.001, "s": 1, "": 1, "m": 60, "h": 3600}[m.group(2)]
    if value <= 0:
        raise ConfigError(f"{what}: must be positive, got {text!r}")
    return value
