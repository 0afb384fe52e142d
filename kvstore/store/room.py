"""Making room in a tier, written once for every tier: the make-room loop and the watermark loop.

``make_room`` is what an allocation does when its tier is full: take the oldest chunk of the tier's eviction
queue, evict it if it may leave now (or set it aside, keeping its place, if it may not: being written, being
copied, leased elsewhere), and try again, until the allocation succeeds or the queue is empty. The DRAM arena
(``Store.allocate_host``), the disk tier's charge (``DiskLedger._charge``) and the GPU pool
(``GpuLedger._allocate``) differ only in those three arguments.

``shed_to_low`` is the background watermark round: once a tier is above its high watermark, move its oldest
chunks out until it is under the low one, stopping at the first chunk that cannot leave (that is for another
round, or another mover, to fix). DRAM (``DiskLedger.rebalance``) and the GPU tier (``GpuLedger.shed``, run by
the daemon's GPU mover and the simulator's) share it.
"""

from __future__ import annotations

from typing import Callable, Protocol, TypeVar

from .entry import Entry

T = TypeVar("T")


class Victims(Protocol):
    """Where ``make_room`` takes its victims from: an ``eviction.EvictionQueue``, or one tenant's chunks of a
    guarded tier (``tier_guard.OwnChunks``)."""

    def pop_oldest(self) -> Entry | None: ...

    def push_oldest(self, entries: list[Entry]) -> None: ...


def make_room(attempt: Callable[[], T | None], queue: Victims, may_leave: Callable[[Entry], bool],
              leave: Callable[[Entry], object]) -> T | None:
    """``attempt()`` until it returns something other than None, evicting ``queue``'s oldest chunks (those that
    ``may_leave``) in between; None when the queue runs out. Skipped chunks go back to the old end, in order."""
    skipped: list[Entry] = []
    try:
        while True:
            got = attempt()
            if got is not None:
                return got
            victim = queue.pop_oldest()
            if victim is None:
                return None
            if not may_leave(victim):
                skipped.append(victim)
                continue
            leave(victim)
    finally:
        queue.push_oldest(skipped)


def shed_to_low(over_high: Callable[[], bool], over_low: Callable[[], bool], next_victim: Callable[[], Entry | None],
                leave: Callable[[Entry], bool]) -> int:
    """Above the high watermark, ``leave`` the ``next_victim`` until under the low one; stops when there is no
    victim or one cannot leave (``leave`` returns False). Returns how many left."""
    if not over_high():
        return 0
    moved = 0
    while over_low():
        victim = next_victim()
        if victim is None or not leave(victim):
            break
        moved += 1
    return moved
