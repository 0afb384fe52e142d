"""Requests refused for their size (``LimitError``): one log line each, so an operator sees who sent what.

A client that loops on an oversized request must not flood the log: at most ``PER_SECOND`` lines are written a
second, and the next line written says how many were left out meanwhile (``unlogged``).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ... import logs
from ...errors import LimitError
from ...protocol.wire import Op

PER_SECOND = 10


class RefusalLog:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.refused = 0          # every refusal, logged or not
        self._second = -1.0
        self._lines = 0           # lines written in the current second
        self._unlogged = 0        # refusals left out since the last line

    def note(self, transport: str, session: Any, op: int | None, header_bytes: int, exc: LimitError) -> None:
        """Log one refused request: where it came from (its session, None before hello), which operation, how
        large its header was and why."""
        self.refused += 1
        now = self.clock()
        if now - self._second >= 1.0:
            self._second, self._lines = now, 0
        if self._lines >= PER_SECOND:
            self._unlogged += 1
            return
        self._lines += 1
        unlogged, self._unlogged = self._unlogged, 0
        logs.warning("request_refused", transport=transport, client=getattr(session, "client_id", "") or "-",
                     op=_op_name(op), header_bytes=header_bytes, reason=exc.message or str(exc), unlogged=unlogged)


def _op_name(op: int | None) -> str:
    if op is None:
        return "-"
    try:
        return Op(op).name.lower()
    except ValueError:
        return str(op)
