"""The life cycle every mover shares (disk: ``tiers/disk/mover.py``, GPU: ``tiers/gpu/mover.py``, remote:
``tiers/remote/mover.py``).

A mover does the I/O its ledger asks for (``store/ledgers/``) and nothing else: ``start(loop)`` once the event loop
runs, ``wake()`` when its ledger recorded new intents (called by the ledger, synchronously, on the loop),
``drain(deadline)`` at stop (start nothing new the ledger has not asked for yet, and wait until what is in flight
has ended, or until ``deadline`` on ``time.monotonic``; True when it all ended), ``close()`` after the drain, and
``stats()`` for the daemon's stats reply. Operations in flight per chunk are in one table, ``in_flight`` (key
to the future a waiting get awaits).

One way to wait: ``wait_until(predicate, deadline)`` is ``asyncio.Condition.wait_for`` on the mover's condition,
which every completion notifies (``changed``, callable from plain callbacks: the notification runs as a task
only while somebody waits, so completions with nobody waiting cost nothing). No mover polls for a state change
on a timer; the GPU mover alone polls its copies' ``done()`` while copies are in flight (a GPU copy has no
completion callback the event loop can wait on).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable


class MoverLife:
    """The shared part of every mover (see the module docstring)."""

    def __init__(self) -> None:
        self.in_flight: dict[bytes, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cond: asyncio.Condition | None = None
        self._waiting = 0
        self._notify_task: asyncio.Task | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._cond = asyncio.Condition()
        self.wake()

    def wake(self) -> None:
        """New intents in the ledger: act on them (each mover says how)."""

    def idle(self) -> bool:
        """Whether nothing is in flight (each mover says what counts)."""
        return not self.in_flight

    async def drain(self, deadline: float) -> bool:
        """Wait until nothing is in flight, or ``deadline``; True when nothing is."""
        self.wake()
        return await self.wait_until(self.idle, deadline)

    def close(self) -> None:
        """Give back what the mover holds (after ``drain``)."""

    def stats(self) -> dict[str, int]:
        return {}

    # -- the one way to wait ---------------------------------------------------------------------------------------
    def changed(self) -> None:
        """Something a waiter may wait for happened (a transfer ended): wake the waiters, if any."""
        if self._waiting and self._loop is not None and self._notify_task is None:
            self._notify_task = self._loop.create_task(self._notify())

    async def _notify(self) -> None:
        assert self._cond is not None
        self._notify_task = None
        async with self._cond:
            self._cond.notify_all()

    async def wait_until(self, predicate: Callable[[], bool], deadline: float | None) -> bool:
        """``predicate()`` once it holds, or its value at ``deadline`` (``time.monotonic``; None: no deadline)."""
        if predicate():
            return True
        remaining = None if deadline is None else deadline - time.monotonic()
        if (remaining is not None and remaining <= 0) or self._cond is None:
            return predicate()
        self._waiting += 1
        try:
            await asyncio.wait_for(self._until(predicate), remaining)
        except asyncio.TimeoutError:
            pass
        finally:
            self._waiting -= 1
        return predicate()

    async def _until(self, predicate: Callable[[], bool]) -> None:
        assert self._cond is not None
        async with self._cond:
            await self._cond.wait_for(predicate)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the loop from a worker thread (dropped once the loop has closed: stopping)."""
        assert self._loop is not None, "call_soon before start"
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass
