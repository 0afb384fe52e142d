"""The one breaker (kvstore/breaker.py) that the remote tier, the connectors' daemon link and the router's fleet
share: closed until a failure, then one probe per retry interval, closed again by a success."""

from __future__ import annotations

from kvstore.breaker import Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_closed_until_a_failure_then_waits_the_retry_interval():
    clock = Clock()
    b = Breaker(2.0, clock)
    assert b.closed and b.allows() and not b.try_probe()   # nothing to probe while closed
    assert b.failed() is True and not b.closed and b.outages == 1
    assert not b.allows() and not b.try_probe()
    clock.now += 1.9
    assert not b.allows()
    clock.now += 0.2
    assert b.allows() and b.try_probe()
    assert not b.try_probe() and not b.allows()            # one probe at a time
    assert b.failed() is False and b.outages == 1          # still the same outage
    clock.now += 2.0
    assert b.try_probe()
    assert abs(b.succeeded() - 4.1) < 1e-9 and b.closed


def test_success_reports_the_outage_once():
    clock = Clock()
    b = Breaker(1.0, clock)
    assert b.succeeded() is None                           # closed: nothing to report
    b.failed()
    clock.now += 3.5
    assert abs(b.succeeded() - 3.5) < 1e-9
    assert b.closed and b.succeeded() is None
    b.failed()
    assert b.outages == 2
