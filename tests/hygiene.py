"""The check that a test session leaves the machine as it found it.

Tests are guests: they must never touch the user's kvstore directories (disk cache, runtime dir with the
default socket), never leave a shared-memory arena in ``/dev/shm`` or a ``/tmp/kvs-*`` directory behind, and
never leave a daemon running. ``daemons.py`` makes that structural; this module proves it held. ``take()``
snapshots what exists; ``problems(before, after)`` names what is new and still there.

The machine may be shared: another user's live daemon maps its own new arena and keeps its log, socket and
working files open in its own ``/tmp/kvs-*`` directory. Such entries, held by a live process that is not
ours, are not counted; anything else new is (an orphaned arena is what a SIGKILLed daemon that nobody cleaned
up leaves). The user's own directories are compared file by file: any file new or gone there is named.
"""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass

SHM_GLOB = "/dev/shm/kvstore.*"
TMP_GLOB = "/tmp/kvs-*"


def user_dirs(env: dict[str, str]) -> list[str]:
    """The kvstore directories of the user whose environment is ``env`` (as it was before the session)."""
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    dirs = [os.path.join(cache, "kvstore"), f"/tmp/kvstore-{os.getuid()}"]
    if env.get("XDG_RUNTIME_DIR"):
        dirs.append(os.path.join(env["XDG_RUNTIME_DIR"], "kvstore"))
    return dirs


@dataclass(frozen=True)
class Snapshot:
    arenas: frozenset[str]
    user_files: frozenset[str]
    tmp_dirs: frozenset[str]


def _tree(root: str) -> set[str]:
    if not os.path.lexists(root):
        return set()
    found = {root}
    for top, dirs, files in os.walk(root):
        found.update(os.path.join(top, name) for name in dirs + files)
    return found


def take(dirs: list[str], skip_tmp: str = "") -> Snapshot:
    """What exists now: arenas, everything under the user's ``dirs``, and /tmp/kvs-* (but ``skip_tmp``)."""
    user = set().union(*(_tree(d) for d in dirs))
    tmp = {p for p in glob.glob(TMP_GLOB) if p != skip_tmp}
    return Snapshot(frozenset(glob.glob(SHM_GLOB)), frozenset(user), frozenset(tmp))


def _ancestors(pid: int) -> set[int]:
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return seen


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _holders(path: str) -> list[int]:
    """Live processes that map ``path`` or hold a file, working directory or bound socket under it."""
    inside = path.rstrip("/") + "/"
    sockets = [s for s in _bound_unix_paths() if s.startswith(inside)]
    found = []
    for pid in _pids():
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


def _bound_unix_paths() -> list[str]:
    try:
        with open("/proc/net/unix") as f:
            return [line.split()[-1] for line in f.read().splitlines()[1:] if len(line.split()) >= 8]
    except OSError:
        return []


def our_daemons() -> list[int]:
    """kvstore daemons still running that this process started (directly or not)."""
    me = os.getpid()
    found = []
    for pid in _pids():
        if pid == me or me not in _ancestors(pid):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"kvstore" in argv and b"serve" in argv:
            found.append(pid)
    return found


def _owned_by_another_live_process(path: str) -> bool:
    """A scratch root of another live test session or benchmark (``daemons.scratch_root``)."""
    try:
        with open(os.path.join(path, "owner.pid")) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return False
    return pid != os.getpid() and os.path.exists(f"/proc/{pid}")


def _left_behind(path: str) -> bool:
    """Nobody holds ``path``, or only processes of ours do (a daemon we failed to stop)."""
    me = os.getpid()
    if _owned_by_another_live_process(path):
        return False
    holders = _holders(path)
    return not holders or any(pid > 0 and me in _ancestors(pid) for pid in holders)


def problems(before: Snapshot, after: Snapshot, grace: float = 1.0) -> list[str]:
    """One line per thing the session left behind or touched; empty when the machine is as it was.

    New arenas and /tmp/kvs-* directories count only if nobody else holds them, checked twice ``grace``
    seconds apart, so that another session tearing down its own at this moment is not named.
    """
    lines = [f"kvstore daemon still running: pid {pid}" for pid in our_daemons()]
    new = sorted((after.arenas - before.arenas) | (after.tmp_dirs - before.tmp_dirs))
    suspects = [path for path in new if _left_behind(path)]
    if suspects:
        time.sleep(grace)
    for path in suspects:
        if os.path.lexists(path) and _left_behind(path):
            what = "shared-memory arena" if path.startswith("/dev/shm/") else "directory"
            lines.append(f"{what} left behind: {path}")
    lines += [f"the user's kvstore directory was touched: {path} is new"
              for path in sorted(after.user_files - before.user_files)]
    lines += [f"the user's kvstore directory was touched: {path} is gone"
              for path in sorted(before.user_files - after.user_files)]
    return lines
