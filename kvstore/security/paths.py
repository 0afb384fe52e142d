"""Owner-only directories: every level kvstore creates is 0700, and a level it did not create is left alone.

``os.makedirs(path, mode=0o700)`` applies the mode to the last level only; the parents it makes get 0777 minus
the umask (0755 usually), so ``--socket a/b/kv.sock`` or a first ``~/.cache/kvstore/chunks`` would leave
world-listable directories behind. ``make_private_dirs`` creates each missing level itself, sets 0700 on it
(``mkdir``'s mode is filtered by the umask, so it is set again explicitly) and returns the levels it made, in
creation order, so that a start-up that fails later can remove them again (``remove_created_dirs``). A
directory that was already there is never chmod-ed: it belongs to whoever made it.
"""

from __future__ import annotations

import os

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
