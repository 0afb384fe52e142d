"""One circuit breaker for every peer kvstore talks to and may lose: the remote store (``tiers/remote/base.py``), the
daemon as a connector sees it (``connectors/common/store.py``) and each daemon of a router's fleet
(``routing/fleet.py``).

    closed ──failure──> open ──retry_s later, one probe──> closed (success) | open again (failure)

A closed breaker lets every call through. The first failure opens it: calls are refused at once (the caller turns
that into a miss), and once ``retry_s`` has passed since the last failure a single probe is let through
(``try_probe``; no other until it ends). The probe's success closes the breaker and returns how long the outage
lasted, so that the caller logs one line per outage, not one per call. No timer and no thread: time is read when
a caller asks. Not locked: a caller that shares one between threads holds its own lock around it.
"""

from __future__ import annotations

import time
from typing import Callable


class Breaker:
    def __init__(self, retry_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.retry_s = float(retry_s)
        self.clock = clock
        self.closed = True
        self.outages = 0          # times it opened
        self._down_since = 0.0
        self._next_try = 0.0
        self._probing = False

    def allows(self) -> bool:
        """Whether a call may go out now: the breaker is closed, or a retry is due (no probe marked)."""
        return self.closed or (not self._probing and self.clock() >= self._next_try)

    def try_probe(self) -> bool:
        """While open: True once a retry is due (marking a probe in flight until ``failed``/``succeeded``)."""
        if self.closed or self._probing or self.clock() < self._next_try:
            return False
        self._probing = True
        return True

    def failed(self) -> bool:
        """A call or probe failed: open (or keep open) and wait ``retry_s``. True when this failure opened it."""
        now = self.clock()
        self._probing = False
        self._next_try = now + self.retry_s
        if not self.closed:
            return False
        self.closed = False
        self._down_since = now
        self.outages += 1
        return True

    def succeeded(self) -> float | None:
        """A call or probe succeeded: close. Returns the outage's length in seconds when it was open, else None."""
        self._probing = False
        if self.closed:
            return None
        self.closed = True
        return self.clock() - self._down_since
