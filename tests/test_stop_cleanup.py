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


def _log_time(log: str, event: str) -> float:
    """The wall-clock time of the daemon's first ``event`` line (its own timestamp)."""
    line = next(line for line in log.splitlines() if f"event={event}" in line)
    return datetime.datetime.strptime(line[3:26], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_the_process_ends_right_after_it_logs_stopped(start_daemon):
    """A large arena (which took seconds to free at stop while every page was reserved up front) and a client
    that came and went: the process is gone well within a second of SIGTERM, and at once after ``stopped``."""
    d = start_daemon("--host-mem", large_host_mem())
    with d.client() as c:
        keys = [os.urandom(16) for _ in range(8)]
        c.put(keys, [b"s" * 100_000] * 8)
        with c.get(keys):
            pass
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=30) == 0
    exited = time.time()
    log = d.log()
    assert exited - _log_time(log, "stopping") < 1.0, log[-1500:]
    assert exited - _log_time(log, "stopped") < 0.5, log[-1500:]


def large_host_mem() -> str:
    """Half the memory available now, at most 8 GiB: a size whose pages cost time to reserve and free."""
    from kvstore.defaults import available_memory

    return f"{min(8 << 10, available_memory() // 2 >> 20)}MiB"
