"""Running a probe as another Unix user, in a forked child that drops its uid (tests that run as root)."""

from __future__ import annotations

import os
from typing import Callable


def as_other_user(uid: int, gid: int, probe: Callable[[], list[str]]) -> list[str]:
    """Run ``probe()`` in a forked child that has dropped to ``uid``/``gid``; return the lines it reports (or one
    line ``probe failed: ...``). The child never returns into pytest."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            report = "\n".join(probe())
            os.write(write_end, report.encode())
        except BaseException as exc:  # noqa: BLE001 - report everything to the parent
            os.write(write_end, f"probe failed: {exc!r}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out.splitlines()
