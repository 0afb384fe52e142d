"""What ``/proc`` says about live processes: who holds a path, which kvstore arenas a process maps, which
processes descend from which. Read by the daemon harness (``daemons.py``: an arena is freed only when no live
process maps it) and by the test session's guard (``tests/support/hygiene.py``). Linux only; nothing here changes
anything."""

from __future__ import annotations

import os

SHM_PREFIX = "/dev/shm/kvstore."


def ancestors(pid: int) -> set[int]:
    """``pid`` and the processes it descends from (as far as ``/proc`` shows them)."""
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return seen


def pids() -> list[int]:
    """Every live process's id."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def holders(path: str) -> list[int]:
    """Live processes that map ``path`` or hold a file, working directory or bound socket under it."""
    inside = path.rstrip("/") + "/"
    sockets = [s for s in bound_unix_paths() if s.startswith(inside)]
    found = []
    for pid in pids():
        try:
            with open(f"/proc/{pid}/maps") as f:
                if path in f.read():
                    found.append(pid)
                    continue
            links = [os.readlink(f"/proc/{pid}/cwd")]
            links += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if any(link == path or link.startswith(inside) for link in links):
            found.append(pid)
    return found if found or not sockets else [-1]   # a bound socket whose owner we cannot see


def bound_unix_paths() -> list[str]:
    """The paths of the Unix sockets bound on this machine."""
    try:
        with open("/proc/net/unix") as f:
            return [line.split()[-1] for line in f.read().splitlines()[1:] if len(line.split()) >= 8]
    except OSError:
        return []


def cmdline(pid: int) -> list[bytes]:
    """Process ``pid``'s arguments (empty if it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def is_daemon(argv: list[bytes]) -> bool:
    """Whether ``argv`` is a kvstore daemon's (``kvstore serve``)."""
    return b"kvstore" in argv and b"serve" in argv


def mapped_arenas(pid: int) -> set[str]:
    """The kvstore arenas in /dev/shm that process ``pid`` maps (empty if it is gone)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split(None, 5)[5].strip().removesuffix(" (deleted)") for line in f
                    if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith(SHM_PREFIX)}
    except OSError:
        return set()
