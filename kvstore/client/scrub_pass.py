"""Running a scrub pass from a client: start it, follow its progress, stop it when the caller gives up.

The daemon answers SCRUB_START at once (``server/requests/scrub_passes.py``); the client then asks SCRUB_STATUS every
``POLL_S`` seconds, hands each answer's progress to the caller, and returns the report once the pass has ended.
Every SCRUB_STATUS keeps the pass alive: a client killed outright stops asking, and the daemon stops its pass
``KEEPALIVE_S`` seconds later. When the caller's ``timeout`` passes, or anything interrupts the wait (Ctrl-C),
the client cancels the pass before it returns or raises: a pass never outlives the interest of whoever started it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

from ..errors import InternalError, KVStoreError
from ..protocol.wire import Op

POLL_S = 0.5
KEEPALIVE_S = 10.0

Call = Callable[[dict[str, Any]], tuple[dict[str, Any], list[Any]]]
Progress = Callable[[dict[str, Any]], None]


def run_pass(call: Call, rate: int, timeout: float | None, progress: Progress | None) -> dict[str, Any]:
    """One pass at ``rate`` bytes/s (0: no bound), stopped after ``timeout`` seconds (None: never).

    Returns the pass's report (``cancelled`` is set when the timeout stopped it). Raises what ``call`` raises,
    after cancelling the pass, and InternalError when the pass failed in the daemon."""
    started = time.monotonic()
    header, _ = call({"op": Op.SCRUB_START, "rate": rate, "keepalive_ms": int(KEEPALIVE_S * 1000)})
    pass_id = header["pass"]
    try:
        while True:
            status, _ = call({"op": Op.SCRUB_STATUS, "pass": pass_id})
            if status["state"] != "running":
                return report_of(status)
            if progress is not None:
                progress(status["progress"])
            if timeout is not None and time.monotonic() - started >= timeout:
                return report_of(cancel(call, pass_id)[0])
            time.sleep(POLL_S)
    except BaseException:
        with contextlib.suppress(KVStoreError):
            cancel(call, pass_id)
        raise


def cancel(call: Call, pass_id: int = 0) -> list[dict[str, Any]]:
    """Stop pass ``pass_id`` (0: every pass clients started); the final status of each pass stopped."""
    header, _ = call({"op": Op.SCRUB_CANCEL, "pass": pass_id})
    return header["stopped"]


def report_of(status: dict[str, Any]) -> dict[str, Any]:
    if status["state"] == "failed":
        raise InternalError(f"scrub pass {status['pass']} failed in the daemon: {status.get('error')}")
    return status["scrub"]
