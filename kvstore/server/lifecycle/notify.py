"""Service-manager notification (systemd ``Type=notify``), written against the datagram protocol directly.

The manager passes ``NOTIFY_SOCKET``: a path, or ``@name`` for the abstract namespace. Each notification is one
datagram of newline-separated ``KEY=VALUE`` assignments (``READY=1``, ``STOPPING=1``, ``WATCHDOG=1``,
``STATUS=...``). Without ``NOTIFY_SOCKET`` every call is a no-op, so the daemon runs the same anywhere.
The watchdog interval is half of ``WATCHDOG_USEC`` (when ``WATCHDOG_PID`` is unset or names this process), so
a stuck event loop misses its ping and the manager restarts the daemon.
"""

from __future__ import annotations

import os
import socket

from ... import logs


def notify(*assignments: str) -> bool:
    """Send one notification; True when it was sent. Failures are logged, never raised."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        logs.warning("notify_failed", reason="NOTIFY_SOCKET is neither a path nor @abstract", socket=address)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(assignments).encode())
    except OSError as exc:
        logs.warning("notify_failed", reason=exc.strerror or repr(exc), socket=address.lstrip("\0"))
        return False
    logs.debug("notified", state=" ".join(a for a in assignments if not a.startswith("STATUS=")))
    return True


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings the manager asked for, or None."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 2e6
