"""Owner-only directories: every level kvstore creates is 0700, and a level it did not create is left alone.

``os.makedirs(path, mode=0o700)`` applies the mode to the last level only; the parents it makes get 0777 minus
the umask (0755 usually), so ``--socket a/b/kv.sock`` or a first ``~/.cache/kvstore/chunks`` would leave
world-listable directories behind. ``make_private_dirs`` creates each missing level itself, sets 0700 on it
(``mkdir``'s mode is filtered by the umask, so it is set again explicitly) and returns the levels it made, in
creation order, so that a start-up that fails later can remove them again (``remove_created_dirs``). A
directory that was already there is never chmod-ed: it belongs to whoever made it.

Replaceable directories. In a directory anyone may write to and that lacks the sticky bit, any local user can
rename or unlink the daemon's socket and bind one of their own in its place, so clients would talk to them.
``unsafe_levels`` finds such levels of a path (the socket's own directory and those above it);
``socket_dir_risk`` decides what start-up does about them: the socket's own directory, owned by another user,
is refused (nothing the daemon's user can do makes it safe); one the daemon's user owns, or a level above it,
gets a warning that names the directory and the fix (``chmod o-w`` or ``chmod +t``), since the user can fix it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

PRIVATE_DIR_MODE = 0o700


def missing_levels(path: str) -> list[str]:
    """The levels of ``path`` that do not exist yet, outermost first."""
    missing: list[str] = []
    level = os.path.abspath(path)
    while not os.path.lexists(level):
        missing.append(level)
        parent = os.path.dirname(level)
        if parent == level:
            break
        level = parent
    return missing[::-1]


def make_private_dirs(path: str) -> list[str]:
    """Create every missing level of ``path`` with mode 0700; return the levels created (outermost first).

    Raises OSError as ``os.mkdir`` does (the caller words it for its flag); a level another process creates at
    the same moment is taken as it is.
    """
    created: list[str] = []
    try:
        for level in missing_levels(path):
            try:
                os.mkdir(level, PRIVATE_DIR_MODE)
            except FileExistsError:
                continue   # made by someone else meanwhile: theirs, not ours to chmod
            created.append(level)
            os.chmod(level, PRIVATE_DIR_MODE)
    except OSError:
        remove_created_dirs(created)
        raise
    if not os.path.isdir(path):
        remove_created_dirs(created)
        raise NotADirectoryError(20, "Not a directory", path)
    return created


def remove_created_dirs(created: list[str]) -> None:
    """Remove the levels ``make_private_dirs`` made, innermost first, where they are still empty."""
    for level in reversed(created):
        try:
            os.rmdir(level)
        except OSError:
            return   # not empty (or gone): what is left above it stays too


def replaceable(st: os.stat_result) -> bool:
    """A directory others may write to without the sticky bit: anyone can replace what is in it."""
    return bool(st.st_mode & stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX


def unsafe_levels(directory: str) -> list[tuple[str, os.stat_result]]:
    """The existing levels of ``directory`` (itself first, then its parents) that are ``replaceable``."""
    found = []
    level = os.path.abspath(directory)
    while True:
        try:
            st = os.stat(level)
        except OSError:
            st = None
        if st is not None and replaceable(st):
            found.append((level, st))
        parent = os.path.dirname(level)
        if parent == level:
            return found
        level = parent


@dataclass(frozen=True)
class SocketDirRisk:
    directory: str
    refuse: bool     # the socket's own directory, owned by another user
    line: str        # what to tell the operator, with the fix


def socket_dir_risk(socket_path: str, uid: int | None = None) -> SocketDirRisk | None:
    """What is wrong with the directories above ``socket_path`` (see the module docstring), or None."""
    uid = os.getuid() if uid is None else uid
    own = os.path.dirname(os.path.abspath(socket_path))
    levels = unsafe_levels(own)
    if not levels:
        return None
    where, st = levels[0]
    if where == own and st.st_uid != uid:
        return SocketDirRisk(where, True, f"--socket: directory {where} is writable by every user, has no sticky "
                             f"bit and belongs to uid {st.st_uid}: anyone could replace the socket; put it in a "
                             f"directory of your own (e.g. $XDG_RUNTIME_DIR/kvstore)")
    return SocketDirRisk(where, False, f"directory {where} above the socket is writable by every user and has no "
                         f"sticky bit: anyone could replace the socket; run chmod o-w {where} (or chmod +t "
                         f"{where}), or choose another --socket")
