"""Process identity that survives pid reuse: (pid, start time in clock ticks since boot)."""

from __future__ import annotations

import os


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat, or None if there is no such process (in this pid namespace)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; fields after the last ')' are plain.
    rest = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def self_identity() -> tuple[int, int]:
    """Our (pid, start time), or (pid, 0) when /proc is not our pid namespace's (a container sharing the host's
    /proc sees pid 1 as the host's init): a wrong identity must never be claimed, since the daemon keeps the
    leases of a client it believes alive."""
    pid = os.getpid()
    try:
        if os.readlink("/proc/self") != str(pid):
            return pid, 0
    except OSError:
        return pid, 0
    return pid, process_start_time(pid) or 0
