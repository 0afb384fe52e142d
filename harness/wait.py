"""The one way the harness, the tests and the benchmarks wait: on a condition, polled until it holds or a
timeout passes, never for a fixed time."""

from __future__ import annotations

import time
from typing import Callable


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` every ``interval`` seconds until it holds or ``timeout`` passes.

    Returns:
        True if it held (checked once more at the end), False if the timeout passed first.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)   # the poll's interval: what is waited for is the predicate
    return bool(predicate())
