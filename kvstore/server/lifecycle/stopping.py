"""The stop budget: every deadline of the graceful stop, derived from ``--shutdown-timeout`` alone.

A stop has five steps, each with a deadline counted from SIGTERM as a share of the one budget ``B``:

    drain    0.5 B   puts being written commit (or are abandoned); new work is refused at once
    remote   0.6 B   background puts to the remote store in flight reach it
    disk     0.8 B   the write-back queue is on disk
    close    0.9 B   movers, backends and sockets closed, the arena removed
    forced   1.0 B   the process ends itself (exit 1), removing its socket and arena files first

Shares rather than fixed seconds: a fixed disk-flush bound (it was 30 s) next to a forced exit derived from the
budget (2 B + 1 s) let the forced exit cut a flush that the budget allowed, and a budget raised for a slow disk
still capped the flush at 30 s. ``StopPlan.from_budget`` checks at start that the budget is usable and the
deadlines are in order, so a wrong edit of the shares is a start-up error, not a stop that overruns.
"""

from __future__ import annotations

import os
import threading
from dataclasses import astuple, dataclass
from itertools import pairwise
from typing import Callable

from ... import logs
from ...errors import ConfigError

MIN_BUDGET_S = 0.5      # below this the sockets and the arena may not be closed before the forced exit
MAX_BUDGET_S = 3600.0
SHARES = (0.5, 0.6, 0.8, 0.9, 1.0)   # drain, remote, disk, close, forced (see the table above)


@dataclass(frozen=True)
class StopPlan:
    """Seconds after SIGTERM by which each step must be done."""

    drain: float
    remote: float
    disk: float
    close: float
    forced: float

    @classmethod
    def from_budget(cls, budget: float) -> "StopPlan":
        if not MIN_BUDGET_S <= budget <= MAX_BUDGET_S:
            raise ConfigError(f"--shutdown-timeout: {budget:g}s is outside {MIN_BUDGET_S:g}s..{MAX_BUDGET_S:g}s; "
                              f"the stop needs time to close its sockets and remove its shared memory")
        plan = cls(*(share * budget for share in SHARES))
        plan.check()
        return plan

    def check(self) -> None:
        steps = astuple(self)
        if not all(0 < a < b for a, b in pairwise(steps)):
            raise ConfigError(f"stop deadlines out of order: {self}; each step must end before the next")

    def remaining(self, step: str, elapsed: float) -> float:
        """Seconds left for ``step`` when ``elapsed`` seconds of the stop have passed (0 when overdue)."""
        return max(0.0, getattr(self, step) - elapsed)


def arm_forced_exit(seconds: float, leftovers: Callable[[], list[str]]) -> threading.Timer:
    """End the process after ``seconds`` if the graceful stop has not (a hung step must not pin it).

    Before exiting it unlinks ``leftovers()`` (the socket and shared-memory files): a forced exit must not
    leave an arena in /dev/shm until reboot. Unlinking by path is safe from this thread.
    """
    def overrun() -> None:
        logs.error("shutdown_overrun", after_s=round(seconds, 3))
        for path in leftovers():
            try:
                os.unlink(path)
            except OSError:
                pass
        os._exit(1)

    timer = threading.Timer(seconds, overrun)
    timer.daemon = True
    timer.start()
    return timer
