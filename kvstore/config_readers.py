"""How each setting's value is read and checked on its own: the type readers of ``config.py``'s ``SETTINGS``.

A reader takes the value as given (a TOML value or a flag's text) and the name to blame (``--flag`` or the config
file's key, ``config_file.py``), and returns the value in force or raises ConfigError naming it. A reader checks
one value alone; checks of values against each other and the machine are ``config.check_config``'s.

May call the leaves (``units``, ``defaults``, ``errors``, ``protocol/event_topics.py``) and ``security/redact.py``;
like ``config.py``, nothing of the daemon (an engine's process loads it).
"""

from __future__ import annotations

import grp
import ipaddress
import os
from typing import Any

from .defaults import EVICTION_POLICIES
from .errors import ConfigError
from .security.redact import redact_url
from .units import parse_seconds, parse_size


def read_str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    return value


def read_socket(value: Any, name: str) -> str:
    """The socket's file path, made absolute (what is logged is what is bound)."""
    text = read_str(value, name)
    if not text.strip():
        raise ConfigError(f"{name}: the path is empty; give the socket's file path, e.g. /run/kvstore/kvstore.sock")
    if text.endswith("/") or os.path.basename(text) in (".", ".."):
        raise ConfigError(f"{name}: {text!r} names a directory; give the socket's file path, e.g. {text.rstrip('/')}"
                          f"/kvstore.sock")
    return os.path.abspath(text)


def read_dir(value: Any, name: str) -> str:
    text = read_str(value, name)
    if not text.strip():
        raise ConfigError(f"{name}: the path is empty; give a directory, e.g. /var/lib/kvstore")
    return os.path.abspath(os.path.expanduser(text))


def read_optional_file(value: Any, name: str) -> str:
    """A file path made absolute, or "" (the setting's default place)."""
    text = read_str(value, name).strip()
    return os.path.abspath(os.path.expanduser(text)) if text else ""


def read_log_level(value: Any, name: str) -> str:
    level = read_str(value, name).lower()
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"{name}: must be one of debug, info, warning, error; got {value!r}")
    return level


def read_tcp(value: Any, name: str) -> str:
    text = read_str(value, name)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{name}: expected HOST:PORT such as 127.0.0.1:7070, got {value!r}")
    return text


def read_port(value: Any, name: str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a port number, got {value!r}") from None
    if not 0 <= port < 65536:
        raise ConfigError(f"{name}: port must be in 0..65535 (0 disables), got {port}")
    return port


def read_disk_size(value: Any, name: str) -> int:
    """A size, 0 to turn the disk tier off, or "auto" (-1: resolved against --disk-dir at start)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return -1
    return parse_size(value, name)


def read_compression(value: Any, name: str) -> str:
    text = read_str(value, name).lower()
    if text not in ("none", "lz4"):
        raise ConfigError(f"{name}: must be none or lz4; got {value!r}")
    return text


def read_io_depth(value: Any, name: str) -> int:
    try:
        depth = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a whole number of requests, got {value!r}") from None
    if not 1 <= depth <= 64:
        raise ConfigError(f"{name}: must be in 1..64, got {depth}")
    return depth


REMOTE_SCHEMES = ("redis", "rediss", "valkey", "valkeys", "mooncake")


def read_remote(value: Any, name: str) -> str:
    """A remote store URL, or "" (no remote tier). Only the scheme and a host are checked here; the backend
    reads the rest, and a store that is down at start is an outage like any other, not an error."""
    text = read_str(value, name).strip()
    if not text:
        return ""
    scheme, sep, rest = text.partition("://")
    accepted = ", ".join(s + "://" for s in REMOTE_SCHEMES)
    if not sep or scheme.lower() not in REMOTE_SCHEMES:
        raise ConfigError(f"{name}: unknown remote store {redact_url(text)!r}; accepted schemes: {accepted} (e.g. "
                          f"redis://127.0.0.1:6379 or mooncake://MASTER:50051?metadata=http://MASTER:8080/metadata)")
    host = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    if not host:
        raise ConfigError(f"{name}: {redact_url(text)!r} names no host; write {scheme}://HOST:PORT")
    return text


def read_remote_wait(value: Any, name: str) -> float:
    seconds = parse_seconds(value, name)
    if seconds > 10:
        raise ConfigError(f"{name}: {seconds}s would let a slow remote store stall lookups; give at most 10s")
    return seconds


def read_policy(value: Any, name: str) -> str:
    text = read_str(value, name).lower()
    if text not in EVICTION_POLICIES:
        raise ConfigError(f"{name}: must be one of {', '.join(EVICTION_POLICIES)}; got {value!r}")
    return text


def read_host(value: Any, name: str) -> str:
    host = read_str(value, name)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{name}: expected an IP address such as 127.0.0.1 or ::1, got {value!r}") from None
    return host


def read_group(value: Any, name: str) -> int | None:
    """A local group, by name or gid, that gets the stream socket (``socket_group``); the empty string: none."""
    if value == "" or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f"{name}: expected a group name or gid, got {value!r}")
    text = str(value).strip()
    try:
        group = grp.getgrgid(int(text)) if text.isdigit() else grp.getgrnam(text)
    except (KeyError, OverflowError):
        raise ConfigError(f"{name}: no group {value!r} on this machine; create it (groupadd) or name another "
                          f"group") from None
    return group.gr_gid


def read_gpu_device(value: Any, name: str) -> int:
    try:
        index = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a CUDA device index such as 0, got {value!r}") from None
    if index < 0:
        raise ConfigError(f"{name}: device index must be 0 or more, got {index}")
    return index


# -- KV cache events (server/events/publisher.py, protocol/kv_events.py) -----------------------------------------
def read_events_endpoint(value: Any, name: str) -> str:
    """A ZeroMQ endpoint to bind (tcp://HOST:PORT or ipc://PATH), or "" (off)."""
    text = read_str(value, name).strip()
    if text and not text.startswith(("tcp://", "ipc://")):
        raise ConfigError(f"{name}: expected tcp://HOST:PORT or ipc://PATH (e.g. tcp://127.0.0.1:5557), "
                          f"got {value!r}")
    return text


def read_events_format(value: Any, name: str) -> str:
    if read_str(value, name).lower() not in ("map", "array"):   # protocol/kv_events.py FORMATS
        raise ConfigError(f"{name}: must be map or array; got {value!r}")
    return value.lower()


def read_events_topic(value: Any, name: str) -> str:
    """A plain topic or a template of an engine's topic (``protocol/event_topics.py``)."""
    from .protocol.event_topics import TopicTemplate

    return TopicTemplate.parse(read_str(value, name)).text


def read_count(value: Any, name: str) -> int:
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a whole number, got {value!r}") from None
    if not 1 <= count <= 10_000_000:
        raise ConfigError(f"{name}: must be in 1..10000000, got {count}")
    return count


def read_share(value: Any, name: str) -> float:
    """A fraction in [0, 1], as a number (0.1) or a percentage ("10%")."""
    text = value.strip() if isinstance(value, str) else value
    try:
        share = float(text[:-1]) / 100 if isinstance(text, str) and text.endswith("%") else float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a fraction such as 0.1 or 10%, got {value!r}") from None
    if isinstance(value, bool) or not 0.0 <= share <= 1.0:
        raise ConfigError(f"{name}: must be a fraction in 0..1 (or 0%..100%), got {value!r}")
    return share


def read_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    return value
