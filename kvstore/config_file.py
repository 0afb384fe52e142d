"""Reading the daemon's TOML config file, and naming where each value came from in errors.

Each key must name a setting (``host_mem`` or ``host-mem``); anything else is an error that lists the known keys.
A relative path in the file (the socket, the disk directory, the CURVE key files) is read against the file's own
directory, so that a file and the files it names can move together; ``~`` still means the home directory. Flags
keep reading relative paths against the working directory. ``Origins`` remembers, for each value taken from the
file, the key as written there, so that an error says ``/etc/kvstore.toml: host_mem: ...`` rather than naming a
flag the operator never typed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# Tables of the file that are not settings, each read by its own module (kvstore/tenants/table.py).
SECTIONS = ("tenants",)


def flag_of(name: str) -> str:
    """The command-line flag of setting ``name`` (``host_mem`` -> ``--host-mem``)."""
    return "--" + name.replace("_", "-")


@dataclass
class Origins:
    """Where each value came from: a flag, or a key of the config file ``file`` (kept as written)."""

    file: str | None = None
    keys: dict[str, str] = field(default_factory=dict)   # setting name -> key in the file, for values from it

    def label(self, name: str) -> str:
        """What an error about setting ``name`` starts with: ``FILE: key`` or ``--flag``."""
        if name in self.keys:
            return f"{self.file}: {self.keys[name]}"
        return flag_of(name)

    def reword(self, exc: ConfigError) -> ConfigError:
        """``exc`` with a leading ``--flag`` replaced by the file and key, when that value came from the file."""
        text = str(exc)
        for name in self.keys:
            flag = flag_of(name)
            if text.startswith((flag + ":", flag + " ")):
                return ConfigError(self.label(name) + text[len(flag):])
        return exc


def read_toml(path: str) -> dict[str, Any]:
    """The TOML file ``path`` as a dict. Raises ConfigError (one line) when missing, unreadable or not TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None


def read_config_file(path: str, origins: Origins, known: Collection[str], paths: Collection[str]) -> dict[str, Any]:
    """The values of the config file ``path`` by setting name; notes in ``origins`` the key of each.

    Args:
        path: the TOML file.
        origins: where the keys are noted.
        known: every setting name.
        paths: the names whose values are paths (read against the file's directory when relative).

    Raises:
        ConfigError: the file is missing, unreadable or not TOML, or a key names no setting.
    """
    data = read_toml(path)
    values = {}
    for key, value in data.items():
        if key in SECTIONS:
            continue
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"config file {path}: unknown key {key!r}; known keys: {', '.join(sorted(known))}")
        values[name] = beside_file(value, path) if name in paths else value
        origins.keys[name] = key
    return values


def beside_file(value: Any, path: str) -> Any:
    """A relative path from the config file ``path``, read against the file's directory."""
    if not isinstance(value, str) or not value.strip() or os.path.isabs(os.path.expanduser(value)):
        return value
    return os.path.join(os.path.dirname(os.path.abspath(path)), value)
