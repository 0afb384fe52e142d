"""Parsing and printing of byte sizes, durations and counts as operators write them (``512MiB``, ``30s``, ``8``).

A size written without a unit is bytes, so it must be whole and — unless it is 0 (a tier or limit turned off)
— at least a page: ``--host-mem 1.5`` or ``--gpu-mem 16`` is refused with a hint to write the unit rather than read
as one or sixteen bytes (``16B`` still means bytes). ``cli/flag_types.py`` turns each parser into an argparse type.
"""

from __future__ import annotations

import re

from .errors import ConfigError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "p": 1000**5, "pb": 1000**5,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5,
}
PAGE = 4096   # the smallest size a bare number (no unit) may give, but 0
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int, what: str = "size") -> int:
    """``"512MiB"`` → 536870912. Integers are bytes. Raises ConfigError naming ``what``."""
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a size such as 512MiB or 4GiB, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"{what}: size must not be negative, got {text}")
        _check_bare_bytes(str(text), what)
        return text
    if not isinstance(text, str):
        raise ConfigError(f"{what}: expected a size such as 512MiB or 4GiB, got {text!r}")
    if text.strip().startswith("-"):
        raise ConfigError(f"{what}: a size must not be negative, got {text!r}; write e.g. 512MiB or 4GiB")
    m = _SIZE_RE.match(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _SIZE_UNITS:
        raise ConfigError(f"{what}: cannot read {text!r} as a size; write e.g. 512MiB, 4GiB or 1000000 (bytes)")
    if unit == "":
        _check_bare_bytes(m.group(1), what)
    elif unit == "b" and "." in m.group(1):
        raise ConfigError(f"{what}: {text!r} is not a whole number of bytes; write e.g. {m.group(1)}MiB")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def _check_bare_bytes(number: str, what: str) -> None:
    """A size without a unit is bytes: refuse a fraction, and a count of bytes below a page (but 0), which is
    almost surely a size whose unit was left out."""
    if "." in number:
        raise ConfigError(f"{what}: {number!r} has no unit, so it would be bytes, and bytes are whole; write the "
                          f"unit, e.g. {number}GiB or {number}MiB")
    if 0 < int(number) < PAGE:
        nbytes = f"{number} byte{'' if number == '1' else 's'}"
        raise ConfigError(f"{what}: {number!r} has no unit, so it would be {nbytes}, less than a page; write the "
                          f"unit, e.g. {number}GiB or {number}MiB ({number}B if bytes are meant)")


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
    elif str(text).strip().startswith("-"):
        raise ConfigError(f"{what}: must be positive, got {text!r}; write e.g. 30s, 500ms or 2m")
    else:
        m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|)\s*$", str(text))
        if m is None:
            raise ConfigError(f"{what}: cannot read {text!r} as a duration; write e.g. 30s, 500ms or 2m")
        value = float(m.group(1)) * {"ms": 0.001, "s": 1, "": 1, "m": 60, "h": 3600}[m.group(2)]
    if value <= 0:
        raise ConfigError(f"{what}: must be positive, got {text!r}")
    return value


def parse_count(text: str | int, what: str = "count", minimum: int = 1) -> int:
    """A whole number of at least ``minimum`` (``"8"`` or 8). Raises ConfigError naming ``what``."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ConfigError(f"{what}: expected a whole number, got {text!r}")
    word = str(text).strip()
    digits = word[1:] if word.startswith("-") else word
    if not digits.isdigit():
        raise ConfigError(f"{what}: expected a whole number, got {text!r}")
    value = int(word)
    if value < minimum:
        least = "positive" if minimum == 1 else f"at least {minimum}"
        raise ConfigError(f"{what}: must be {least}, got {text!r}")
    return value
