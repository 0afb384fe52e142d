"""Shared-memory files no daemon serves from: found and freed (``kvstore clean``).

A daemon's files in ``/dev/shm`` are named ``kvstore.<uid>.<hash of the socket path>.{arena,index}`` (plus
``.arena.kept``, the description a clean stop writes for a warm restart, and ``.arena.journal``, the record of
committed slots a crash leaves: ``journal.py``). A running daemon maps its arena and its index and appends to
its journal; a cleanly stopped one leaves its arena and description for the next start on the same socket
(``adoption.py``); a killed one (SIGKILL, OOM) leaves its arena, journal and index, which the next start on the
same socket adopts (what the journal proves) or frees. When no later start comes, these files hold memory until
a reboot, so ``kvstore clean`` finds every such file of the calling user that no process maps and frees those
of one socket (the default one, or ``--socket``), or with ``--all`` of every socket.

Safety: only files that match the daemon's own names and belong to the caller are considered; a file some
process maps is never removed (a running daemon's, or a client still reading an old one). A kept arena whose
socket's lock is held — a daemon is starting on it and may be adopting it — is left alone too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ...mapped.arena import SHM_DIR
from .description import DescriptionError, SUFFIX, read_description
from .journal import SUFFIX as JOURNAL_SUFFIX, read_journal_socket

_NAME = re.compile(r"^kvstore\.(\d+)\.([0-9a-f]{16})\.(arena|index|arena\.kept|arena\.journal)$")


@dataclass(frozen=True)
class Leftover:
    """One daemon file in ``/dev/shm``: what it is, its size, and the socket it served (where known)."""

    path: str
    kind: str          # "arena", "index", "description" or "journal"
    nbytes: int        # memory it holds (allocated blocks)
    socket: str = ""   # from a kept arena's description; "" when unknown
    mapped: bool = False
    locked: bool = False   # its socket's daemon lock is held: a daemon runs (or starts) there

    @property
    def removable(self) -> bool:
        return not self.mapped and not self.locked


def find_leftovers(uid: int | None = None, shm_dir: str = SHM_DIR) -> list[Leftover]:
    """Every daemon file of ``uid`` (default: the caller) in ``shm_dir``, marked with whether it may go."""
    uid = os.getuid() if uid is None else uid
    names = sorted(n for n in _listdir(shm_dir) if (m := _NAME.match(n)) and int(m.group(1)) == uid)
    mapped = _mapped_paths()
    sockets = _sockets_of_kept(shm_dir, names)
    found = []
    for name in names:
        path = os.path.join(shm_dir, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if st.st_uid != uid or not os.path.isfile(path) or os.path.islink(path):
            continue
        kind = _kind_of(name)
        socket = sockets.get(_stem(name), "")
        found.append(Leftover(path, kind, st.st_blocks * 512, socket, path in mapped,
                              bool(socket) and _lock_held(socket + ".lock")))
    return _group_by_daemon(found)


def remove(leftover: Leftover) -> bool:
    """Remove ``leftover`` if it still may go; True when it was removed."""
    if not leftover.removable or leftover.path in _mapped_paths():
        return False
    try:
        os.unlink(leftover.path)
    except FileNotFoundError:
        return False
    return True


def _group_by_daemon(found: list[Leftover]) -> list[Leftover]:
    """A kept arena, its description and its journal stay or go together: each is held when one is."""
    together = ("arena", "description", "journal")
    held = {_stem(f.path) for f in found if not f.removable and f.kind in together}
    out = []
    for f in found:
        if f.kind in together and _stem(f.path) in held and f.removable:
            f = Leftover(f.path, f.kind, f.nbytes, f.socket, f.mapped, True)
        out.append(f)
    return out


def _stem(path: str) -> str:
    return path.removesuffix(SUFFIX).removesuffix(JOURNAL_SUFFIX)


def _kind_of(name: str) -> str:
    if name.endswith(SUFFIX):
        return "description"
    return "journal" if name.endswith(JOURNAL_SUFFIX) else name.rsplit(".", 1)[1]


def _sockets_of_kept(shm_dir: str, names: list[str]) -> dict[str, str]:
    """arena name → the socket its description (or its journal) names (kept arenas only)."""
    sockets: dict[str, str] = {}
    for name in names:
        if name.endswith(JOURNAL_SUFFIX):
            socket = read_journal_socket(os.path.join(shm_dir, name))
            if socket is not None:
                sockets.setdefault(_stem(name), socket)
                sockets[name] = socket
        elif name.endswith(SUFFIX):
            try:
                desc = read_description(os.path.join(shm_dir, name))
            except DescriptionError:
                continue
            if desc is not None:
                sockets[name.removesuffix(SUFFIX)] = desc.socket
                sockets[name] = desc.socket
    return sockets


def _mapped_paths() -> set[str]:
    """Files under /dev/shm some process maps (those whose maps this user may read: its own)."""
    paths: set[str] = set()
    for pid in (p for p in _listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    at = line.find(SHM_DIR + "/")
                    if at >= 0:
                        paths.add(line[at:].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:
            continue
    return paths


def _lock_held(path: str) -> bool:
    """Whether some process holds a flock on the lock file ``path`` (read from /proc/locks, so that looking never
    takes the lock a starting daemon may be about to take); a missing file is no lock."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            return any(len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == want
                       for parts in (line.split() for line in f))
    except OSError:
        return True   # cannot tell: assume a daemon holds it


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
