"""A stopping or missing daemon answers at once (issue 14, item 10).

- A request waiting on the remote store when SIGTERM comes gets ``UnavailableError`` at once, not its answer a
  second later or nothing at all.
- While the stop flushes (here: a background put to a remote store that does not answer — a real
  ``redis-server`` paused with SIGSTOP), requests from connected clients still get ``UnavailableError`` at once
  instead of waiting out the client's timeout.
- A client connecting to an ipc:// socket that does not exist fails at once.
- Every stop deadline is a share of ``--shutdown-timeout``, in order, checked at start.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

import kvstore
from kvstore.errors import ConfigError, UnavailableError
from kvstore.server.lifecycle.stopping import StopPlan
from conftest import short_tempdir, wait_for
from harness.daemons import run_cli

from harness.servers import RedisServer, require

CLIENT_TIMEOUT = 5.0


@pytest.fixture
def paused_redis(tmp_path):
    """A redis-server the test pauses (up, connections accepted, never answering) once the daemon started: a
    store that does not answer at start is taken as down and never asked, so it must answer the start's probe."""
    server = RedisServer(tmp_path / "redis", binary=require("redis-server")).start()
    yield server
    server.resume()
    server.stop()


def test_requests_in_flight_and_during_the_flush_get_unavailable_at_once(start_daemon, paused_redis):
    d = start_daemon("--remote", paused_redis.url, "--remote-wait", "10s", "--shutdown-timeout", "10s")
    paused_redis.pause()
    with d.client(namespace="s", timeout=CLIENT_TIMEOUT) as c, \
            d.client(namespace="s", timeout=CLIENT_TIMEOUT) as other:
        stored = c.chunk_keys(list(range(256)))
        c.put(stored, [os.urandom(64 << 10)])   # its background put to the store hangs: the stop must flush it
        outcome: dict[str, object] = {}

        def lookup_in_flight() -> None:
            try:
                outcome["count"] = c.lookup(c.chunk_keys(list(range(10_000, 10_256))))   # asks the paused store
            except Exception as exc:   # noqa: BLE001 - the test looks at which one
                outcome["error"] = exc

        asked = other.stats()["remote"]["lookups"]
        waiter = threading.Thread(target=lookup_in_flight)
        waiter.start()
        assert wait_for(lambda: other.stats()["remote"]["lookups"] > asked, 10)   # it now waits on the store
        d.proc.send_signal(signal.SIGTERM)
        waiter.join(CLIENT_TIMEOUT + 1)
        # Answered at SIGTERM: a lookup left to end with the store's call would have answered a count (a miss).
        assert isinstance(outcome.get("error"), UnavailableError), outcome

        assert wait_for(lambda: "event=stopping" in d.log(), 5)
        with pytest.raises(UnavailableError, match="shutting down"):
            other.get(stored)                    # while the stop waits for the remote put
    assert d.proc.wait(30) == 0, d.log()


def test_connecting_to_a_socket_that_does_not_exist_fails_at_once():
    workdir = short_tempdir()
    try:
        # Told that no daemon is there, not that one did not answer within the timeout.
        with pytest.raises(kvstore.DaemonUnavailable, match="no kvstore daemon is accepting requests"):
            kvstore.connect("ipc://" + os.path.join(workdir, "none.sock"), timeout=CLIENT_TIMEOUT)
    finally:
        os.rmdir(workdir)


def test_stop_deadlines_are_shares_of_one_budget_in_order():
    plan = StopPlan.from_budget(10.0)
    assert plan.drain < plan.remote < plan.disk < plan.close < plan.forced == 10.0
    assert plan.remaining("disk", 7.5) == pytest.approx(0.5) and plan.remaining("drain", 9) == 0
    for bad in (0.1, 0.0, 7200.0):
        with pytest.raises(ConfigError, match="--shutdown-timeout"):
            StopPlan.from_budget(bad)


def test_too_short_a_budget_is_refused_at_start():
    result = run_cli("serve", "--shutdown-timeout", "0.1s")
    assert result.returncode == 2 and "--shutdown-timeout: 0.1s is outside" in result.stderr.strip()
    assert len(result.stderr.strip().splitlines()) == 1
