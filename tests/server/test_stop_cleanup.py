"""A clean stop leaves nothing of the daemon behind and ends the process at once (issue 24, items 6 and 19).

Daemons here are real processes on sockets in scratch directories; a daemon killed with SIGKILL leaves its
socket, lock and arena, and the next one on the same socket takes them over.
"""

from __future__ import annotations

import os
import signal

from harness.daemons import DaemonProc, with_defaults
from harness.memory import large_host_mem


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


def test_the_process_ends_cleanly_after_it_logs_stopped(start_daemon):
    """A large arena (which took seconds to free at stop while every page was reserved up front) and a client
    that came and went: SIGTERM ends the process cleanly, ``stopped`` its last event. How long the stop takes is
    measured by ``bench/stop_time.py``."""
    d = start_daemon("--host-mem", large_host_mem())
    with d.client() as c:
        keys = [os.urandom(16) for _ in range(8)]
        c.put(keys, [b"s" * 100_000] * 8)
        with c.get(keys):
            pass
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=30) == 0
    events = [line.split("event=", 1)[1].split()[0] for line in d.log().splitlines() if "event=" in line]
    assert "stopping" in events and events[-1] == "stopped", events[-5:]
