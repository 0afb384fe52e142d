"""Leases and reservations: handles with an owner and a deadline.

A handle is an unguessable 63-bit id (from the OS's random source, drawn 512 at a time: a ``secrets.randbits`` per
handle costs a system call on every get), owned by the connection that took it; only that owner
may release, extend or commit it, so a forged or replayed id from another client is an error, not an action.
Deadlines are kept in a heap with lazy deletion: extending pushes a new deadline and the stale one is skipped when
popped, which keeps every operation O(log n). Extending follows the ``max(deadline, now + ttl)`` rule, so a late
extend never shortens a handle.

Overdue, not expired. ``pop_expired`` may be told which owners to spare (``keep``): a handle of such an owner
that reaches its deadline stays live with no deadline (``overdue`` counts them) until it is taken or its owner's
handles are dropped. The daemon spares the leases of local clients whose process it follows and finds alive:
their views are zero-copy windows on the arena, and taking the lease back would let other chunks be written
under a reader that is merely slow (the TTL exists for clients that die, and their death is seen directly).
"""

from __future__ import annotations

import heapq
import math
import os
import struct
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterator, TypeVar

from ..errors import RequestError

T = TypeVar("T")

_ID_BATCH = 512   # ids drawn from the OS at once: one getrandom call per 512 handles instead of one each


def _random_ids() -> Iterator[int]:
    while True:
        for (hid,) in struct.iter_unpack("<Q", os.urandom(8 * _ID_BATCH)):
            yield (hid >> 1) or 1


_new_id = _random_ids().__next__


@dataclass(eq=False)
class Handle(Generic[T]):
    id: int
    owner: bytes
    payload: T
    deadline: float
    ttl: float


@dataclass
class HandleTable(Generic[T]):
    """A table of handles of one kind; ``error`` is raised for unknown, expired or foreign ids."""

    kind: str
    error: type[RequestError]
    _live: dict[int, Handle[T]] = field(default_factory=dict)
    _deadlines: list[tuple[float, int]] = field(default_factory=list)
    _by_owner: dict[bytes, set[int]] = field(default_factory=dict)
    overdue: int = 0   # handles kept past their deadline because their owner was spared (see the docstring)

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Handle[T]]:
        return iter(list(self._live.values()))

    def issue(self, owner: bytes, payload: T, ttl: float, now: float) -> Handle[T]:
        hid = _new_id()
        while hid in self._live:
            hid = _new_id()
        handle = Handle(hid, owner, payload, now + ttl, ttl)
        self._live[hid] = handle
        self._by_owner.setdefault(owner, set()).add(hid)
        heapq.heappush(self._deadlines, (handle.deadline, hid))
        return handle

    def peek(self, owner: bytes, hid: int) -> Handle[T]:
        handle = self._live.get(hid)
        if handle is None:
            raise self.error(f"{self.kind} {hid} is unknown or has expired")
        if handle.owner != owner:
            raise self.error(f"{self.kind} {hid} belongs to another client")
        return handle

    def take(self, owner: bytes, hid: int) -> Handle[T]:
        """Remove and return the owner's handle."""
        handle = self.peek(owner, hid)
        self._forget(handle)
        return handle

    def extend(self, owner: bytes, hid: int, now: float) -> Handle[T]:
        handle = self.peek(owner, hid)
        handle.deadline = max(handle.deadline, now + handle.ttl)
        heapq.heappush(self._deadlines, (handle.deadline, hid))
        return handle

    def pop_expired(self, now: float, keep: Callable[[bytes], bool] | None = None) -> list[Handle[T]]:
        """Remove and return the handles past their deadline, except those whose owner ``keep`` spares."""
        expired = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, hid = heapq.heappop(self._deadlines)
            handle = self._live.get(hid)
            if handle is None or handle.deadline != deadline:
                continue
            if keep is not None and keep(handle.owner):
                handle.deadline = math.inf   # overdue: live until taken or its owner is dropped
                self.overdue += 1
                continue
            self._forget(handle)
            expired.append(handle)
        if len(self._deadlines) > 2 * len(self._live) + 1024:
            self._deadlines = [(h.deadline, h.id) for h in self._live.values()]
            heapq.heapify(self._deadlines)
        return expired

    def ids_of(self, owner: bytes) -> set[int]:
        return self._by_owner.get(owner, set())

    def pop_owner(self, owner: bytes) -> list[Handle[T]]:
        return [self.take(owner, hid) for hid in list(self._by_owner.get(owner, ()))]

    def _forget(self, handle: Handle[T]) -> None:
        del self._live[handle.id]
        ids = self._by_owner.get(handle.owner)
        if ids is not None:
            ids.discard(handle.id)
            if not ids:
                del self._by_owner[handle.owner]
