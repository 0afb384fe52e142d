"""The daemon's Python heap: what the cyclic garbage collector walks, and how long it stops the event loop.

A full collection walks every container object the process holds, and it runs on the event loop's thread: every
request waits for it. Most of what a started daemon holds lives as long as the process (modules, classes,
functions, the config, the tiers' ledgers) and can never become garbage, so ``settle_heap`` collects once after
start-up and freezes what survives (``gc.freeze``): later collections walk only what was made while serving (the
index entries of new chunks, sessions, requests in flight). Frozen objects are still freed by reference counting
when their last reference goes; only a reference cycle among them would never be collected, which is why the
freeze comes after start-up's own garbage is collected and before the first request.

``HeapWatch`` counts collections and the time they take, per generation (``gc.callbacks``), for ``kvstore stats``
and Prometheus (``kvstore_gc_*``): a pause on the loop is a pause of every put and get.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

GENERATIONS = 3   # CPython's cyclic collector: generations 0, 1 and 2 (2: a full collection)


def settle_heap() -> int:
    """Collect start-up's garbage, then freeze every object that survives out of later collections' walks.

    Returns:
        The number of objects now frozen (``gc.get_freeze_count``).
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@dataclass
class GenerationTimes:
    """One generation's collections since the watch began: how many, their total and longest pause."""

    collections: int = 0
    pause_seconds: float = 0.0
    longest_pause_seconds: float = 0.0


@dataclass
class HeapWatch:
    """Times each collection of the cyclic garbage collector (``gc.callbacks``) while installed."""

    generations: list[GenerationTimes] = field(default_factory=lambda: [GenerationTimes() for _ in range(GENERATIONS)])
    _started: float | None = None

    def install(self) -> None:
        """Start timing collections (idempotent)."""
        if self._on_collection not in gc.callbacks:
            gc.callbacks.append(self._on_collection)

    def uninstall(self) -> None:
        """Stop timing collections (idempotent)."""
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:   # installed between a collection's start and its stop
            return
        pause = time.perf_counter() - self._started
        self._started = None
        times = self.generations[min(int(info.get("generation", 0)), GENERATIONS - 1)]
        times.collections += 1
        times.pause_seconds += pause
        times.longest_pause_seconds = max(times.longest_pause_seconds, pause)

    def stats(self) -> dict[str, Any]:
        """The ``gc`` section of ``kvstore stats``: objects frozen, and per generation (``"0"``, ``"1"``, ``"2"``)
        the collections, their total pause and the longest one, in seconds."""
        return {"frozen_objects": gc.get_freeze_count(),
                "generations": {str(g): {"collections": t.collections, "pause_seconds": round(t.pause_seconds, 6),
                                         "longest_pause_seconds": round(t.longest_pause_seconds, 6)}
                                for g, t in enumerate(self.generations)}}
