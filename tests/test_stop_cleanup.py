"""A clean stop leaves nothing of the daemon behind and ends the process at once (issue 24, items 6 and 19).

Daemons here are real processes on sockets in scratch directories; a daemon killed with SIGKILL leaves its
socket, lock and arena, and the next one on the same socket takes them over.
"""

from __future__ import annotations

import datetime
import os
import signal
import time

from daemons import DaemonProc, with_defaults


def _daemon(workdir: str, *flags: str) -> DaemonProc:
    return DaemonProc(workdir, with_defaults(list(flags), workdir))


def test_a_clean_stop_removes_the_lock_a_killed_daemon_left(start_daemon):
    first = start_daemon()
    lock = first.socket_path + ".lock"
    first.kill()
    assert os.path.exists(lock)   # SIGKILL: nothing could remove it
    try:
        for restart in range(2):   # stop after stop
            d = _daemon(first.workdir).start()
            assert restart or "stale_socket_removed" in d.log()
            assert os.path.exists(lock)
            assert d.stop() == 0
            assert not os.path.exists(lock), f"the lock outlived a clean stop:\n{d.log()[-2000:]}"
            assert not os.path.exists(os.path.join(first.workdir, "disk", ".lock"))
    finally:
        d.stop()
        d.remove_leftovers()
