"""The remote path's one executor and its breaker: every call to a remote store goes through here.

A backend (``base.py``) runs each store call on its worker pool (``_submit``), bounded by a deadline (``_call``
blocks on it, ``_acall`` awaits it from the event loop), and counts it. A failed or timed-out call opens the
breaker (``breaker.py``): from then on calls are skipped at once (a miss, counted) while one probe at a time
checks the store, until a probe succeeds and the backend logs that the store is back. Calls in flight are
counted so that ``close`` can wait for them (``_idle``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from typing import Any

from ... import logs
from ...breaker import Breaker



class GuardedCalls:
    """The executor, breaker and call counters a backend inherits (see the module docstring)."""

    def __init__(self, url: str, workers: int, retry_interval: float) -> None:
        self.url = url
        self._pool = cf.ThreadPoolExecutor(2 * workers, thread_name_prefix="kvstore-remote")
        self._lock = threading.Lock()
        self._breaker = Breaker(retry_interval)   # guarded by _lock
        self._closed = False
        self._inflight = 0           # store calls running on a worker
        self._idle = threading.Condition(self._lock)
        self.counters: dict[str, int] = dict.fromkeys((
            "calls", "errors", "timeouts", "skipped", "outages", "hits", "misses",
            "corrupt", "puts", "put_bytes", "get_bytes", "put_dropped"), 0)

    def _probe(self) -> None:
        """Check that the store answers (raise if not); each backend says how."""
        raise NotImplementedError

    def _tracked(self, fn, *args):
        with self._lock:
            self._inflight += 1
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._inflight -= 1
                if not self._inflight:
                    self._idle.notify_all()


    def _submit(self, fn, *args) -> cf.Future | None:
        """Start ``fn(*args)`` on the pool; None when the breaker is open or the backend closed (counted)."""
        with self._lock:
            if self._closed or not self._allow_locked():
                self.counters["skipped"] += 1
                return None
            self.counters["calls"] += 1
        try:
            return self._pool.submit(self._tracked, fn, *args)
        except RuntimeError:        # pool shut down by close()
            return None

    def _call(self, deadline: float, fn, *args):
        """Run ``fn(*args)`` on the pool within ``deadline`` s; ``None`` on any failure."""
        fut = self._submit(fn, *args)
        if fut is None:
            return None
        try:
            return fut.result(deadline)
        except cf.TimeoutError:
            return self._timed_out(fn, deadline)
        except Exception as exc:   # noqa: BLE001 - the store failing is a miss
            self._failed(exc)
            return None

    async def _acall(self, deadline: float, fn, *args):
        """``_call`` for the event loop: the same pool, awaited instead of blocked on."""
        fut = self._submit(fn, *args)
        if fut is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), deadline)
        except asyncio.TimeoutError:
            return self._timed_out(fn, deadline)
        except Exception as exc:   # noqa: BLE001
            self._failed(exc)
            return None

    def _timed_out(self, fn, deadline: float) -> None:
        with self._lock:
            self.counters["timeouts"] += 1
        self._failed(f"{fn.__name__.strip('_')} timed out after {deadline:.2f}s")
        return None

    def _allow_locked(self) -> bool:
        """Whether a call may go to the store; in an outage, maybe start a probe."""
        if self._breaker.closed:
            return True
        if self._breaker.try_probe():
            try:
                self._pool.submit(self._tracked, self._run_probe)
            except RuntimeError:
                self._breaker.failed()
        return False

    def _run_probe(self) -> None:
        try:
            self._probe()
        except Exception as exc:   # noqa: BLE001
            with self._lock:
                self._breaker.failed()
            logs.debug("remote_still_down", url=self.url, reason=str(exc))
            return
        self._recovered()

    def _failed(self, exc: Any) -> None:
        with self._lock:
            self.counters["errors"] += 1
            was_up = self._breaker.failed()
            if was_up:
                self.counters["outages"] += 1
        if was_up:
            logs.warning("remote_unavailable", url=self.url, reason=str(exc),
                         effect="remote lookups are misses until it answers again")
        else:
            logs.debug("remote_call_failed", url=self.url, reason=str(exc))

    def _recovered(self) -> None:
        with self._lock:
            down_for = self._breaker.succeeded()
            if down_for is None:
                return
            skipped = self.counters["skipped"]
        logs.warning("remote_back", url=self.url, down_s=round(down_for, 1), skipped_calls=skipped)

