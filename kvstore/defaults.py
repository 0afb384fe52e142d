"""Where the daemon's files live and how much memory it takes when no setting says: defaults read from the
machine and the environment, with no import of the rest of kvstore (the client, the CLI and ``config.py`` all
use them)."""

from __future__ import annotations

import os

IPC_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL

# The eviction policies a setting may name (``store/policies.py`` builds each queue), and the default.
EVICTION_POLICIES = ("chain-lru", "lru", "s3-fifo")
DEFAULT_POLICY = "chain-lru"

# The tenant a client belongs to when no tenant names it (``tenants/table.py``), and the topic a tenant's
# events go to unless configured (``protocol/event_topics.py``).
DEFAULT_TENANT = "default"

# KV cache events (``server/events/publisher.py``): batches kept for replay, batches queued per subscriber, wire format.
EVENTS_BUFFER = 10_000
EVENTS_HWM = 100_000
EVENTS_FORMAT = "map"

# Soft pins (retention class ``pin``, ``store/retention.py``): a pin's TTL when the put names none, the longest
# one a put may ask, and the share of the host tier all pins may hold when no tenants table bounds them.
PIN_TTL = 60.0
MAX_PIN_TTL = 600.0
MAX_PIN_SHARE = 0.1


def default_runtime_dir() -> str:
    """``$XDG_RUNTIME_DIR/kvstore`` (socket, lock, CURVE keys), else ``/tmp/kvstore-$UID``."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base) and os.access(base, os.W_OK):
        return os.path.join(base, "kvstore")
    return f"/tmp/kvstore-{os.getuid()}"


def default_socket() -> str:
    """``$XDG_RUNTIME_DIR/kvstore/kvstore.sock``, else ``/tmp/kvstore-$UID/kvstore.sock``."""
    return os.path.join(default_runtime_dir(), "kvstore.sock")


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (bytes), or total physical memory where that is not readable."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_host_mem() -> int:
    """A quarter of the memory available now, at least 64 MiB, in whole MiB."""
    return max(64 << 20, (available_memory() // 4) >> 20 << 20)


def default_disk_dir() -> str:
    """``$XDG_CACHE_HOME/kvstore/chunks``, else ``~/.cache/kvstore/chunks``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kvstore", "chunks")   # beside kvstore/native, the built kernels
