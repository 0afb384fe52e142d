"""The check that a test session leaves the machine as it found it.

Tests are guests: they must never touch the user's kvstore directories (disk cache, runtime dir with the
default socket), never leave a shared-memory arena in ``/dev/shm`` or a ``/tmp/kvs-*`` directory behind, and
never leave a daemon running. ``harness/daemons.py`` makes that structural; this module proves it held.
``take()`` snapshots what exists; ``Watch`` follows the session; ``problems()`` names what is new and still there.

The machine may be shared with other sessions, whose daemons make and (when killed) leave arenas and
directories of their own at any moment. So what is new is sorted by who made it:

- held by a live process that is not ours (a running daemon's arena, log, socket, or another live session's
  scratch root, marked with its pid): not counted;
- attributed to us (an arena that one of our daemons was seen to map, by ``Watch`` or by ``daemons.py``),
  a daemon of ours still running, or anything at all when no other kvstore session ran meanwhile: a failure;
- unattributed while another session ran: named as a note, since it may be that session's.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from dataclasses import dataclass, field

from harness.procfs import SHM_PREFIX, ancestors, cmdline, holders, is_daemon, mapped_arenas, pids

SHM_GLOB = SHM_PREFIX + "*"
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


def _is_session(argv: list[bytes]) -> bool:
    return is_daemon(argv) or any(part.endswith(b"pytest") for part in argv)


def our_daemons() -> list[int]:
    """kvstore daemons still running that this process started (directly or not)."""
    me = os.getpid()
    return [pid for pid in pids() if pid != me and me in ancestors(pid) and is_daemon(cmdline(pid))]


@dataclass
class Watch:
    """Follows a session from a thread: which arenas our daemons map, and whether another session ran too."""

    interval: float = 0.5
    ours: set[str] = field(default_factory=set)
    foreign: set[str] = field(default_factory=set)   # a line for each other kvstore session seen
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "Watch":
        self._thread = threading.Thread(target=self._run, name="hygiene-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        me = os.getpid()
        mine = ancestors(me)   # our parents (a shell, `timeout`) are not another session
        for pid in pids():
            argv = cmdline(pid)
            if pid in mine or not _is_session(argv):
                continue
            if me in ancestors(pid):
                if is_daemon(argv):
                    self.ours |= mapped_arenas(pid)
            else:
                self.foreign.add(f"pid {pid}: " + b" ".join(argv).decode(errors="replace")[:100])


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
    found = holders(path)
    return not found or any(pid > 0 and me in ancestors(pid) for pid in found)


def problems(before: Snapshot, after: Snapshot, ours: set[str], shared: bool,
             grace: float = 1.0) -> tuple[list[str], list[str]]:
    """(failures, notes): one line per thing the session left behind or touched; both empty when the machine
    is as it was. ``ours``: arenas known to be this session's; ``shared``: another session ran meanwhile.

    New arenas and /tmp/kvs-* directories count only if nobody else holds them, checked twice ``grace``
    seconds apart, so that another session tearing down its own at this moment is not named.
    """
    failures = [f"kvstore daemon still running: pid {pid}" for pid in our_daemons()]
    notes: list[str] = []
    new = sorted((after.arenas - before.arenas) | (after.tmp_dirs - before.tmp_dirs))
    suspects = [path for path in new if _left_behind(path)]
    if suspects:
        time.sleep(grace)
    for path in suspects:
        if os.path.lexists(path) and _left_behind(path):
            what = "shared-memory arena" if path.startswith("/dev/shm/") else "directory"
            (failures if path in ours or not shared else notes).append(f"{what} left behind: {path}")
    touched = [f"the user's kvstore directory was touched: {path} is new"
               for path in sorted(after.user_files - before.user_files)]
    touched += [f"the user's kvstore directory was touched: {path} is gone"
                for path in sorted(before.user_files - after.user_files)]
    (notes if shared else failures).extend(touched)
    return failures, notes
