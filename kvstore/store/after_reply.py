"""Work a request owes once its reply is out: what a put does after its chunks are readable.

A put's reply may go out as soon as its chunks are readable: listed in the index and in the shared index
(``mapped/index_writer.py``), so that a reader who hears the reply finds them. What a commit does next (the
eviction queue, the checksum job, the counters) changes nothing a reader can see, so the daemon does it after
writing the reply, while the writer is already waking up and copying its next batch, instead of before (on this
machine that was about half of a 16-chunk put's time in the daemon).

Nothing can observe the gap. The daemon runs on one event loop: the work is run right after the reply is written,
and, should a transport not get to it, before the next request is handled (``RequestDispatcher.handle_request``), by
the sweep, and before the stop drains the movers. Until it runs, the chunks are readable but not yet in the eviction
queue (so not evictable), and their checksum job is not yet queued. Only code of the same request, after the
publish, runs in between; it must not rely on that work being done.
"""

from __future__ import annotations

from typing import Callable

from .. import logs


class AfterReply:
    """The work owed by the request being handled, run in the order it was added."""

    def __init__(self) -> None:
        self._owed: list[Callable[[], None]] = []

    def add(self, work: Callable[[], None]) -> None:
        self._owed.append(work)

    def __len__(self) -> int:
        return len(self._owed)

    def run(self) -> None:
        """Run all the owed work. A failure is logged and the rest still runs: the reply has gone out, so there
        is nobody to tell, and skipping the rest would leave other chunks out of the queues."""
        while self._owed:
            owed, self._owed = self._owed, []
            for work in owed:
                try:
                    work()
                except Exception as exc:  # noqa: BLE001 - a bug; the daemon keeps serving
                    logs.error("after_reply_failed", error=repr(exc))
