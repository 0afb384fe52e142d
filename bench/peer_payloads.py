"""The batch every peer of ``bench/peers.py`` moves: its size and the source and destination chunks.

Shared by ``peers.py`` (the runner and most peers) and ``peers_lmcache.py`` (LMCache, driven in its own
virtualenv); it imports neither.
"""

from __future__ import annotations

import numpy as np

BATCH = 16   # chunks a put or a get moves at once


class Payloads:
    """One batch of random source chunks and zeroed destinations, reused by every peer."""

    def __init__(self, size: int):
        rng = np.random.default_rng(size)
        self.size = size
        self.src = [rng.integers(0, 255, size, dtype=np.uint8) for _ in range(BATCH)]
        self.dst = [np.zeros(size, dtype=np.uint8) for _ in range(BATCH)]

    def clear(self) -> None:
        for d in self.dst:
            d[:] = 0

    def check(self) -> None:
        if not all(np.array_equal(s, d) for s, d in zip(self.src, self.dst)):
            raise AssertionError("read back different bytes")
