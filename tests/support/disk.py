"""Waiting on a daemon's disk tier."""

from __future__ import annotations

import kvstore
from harness.wait import wait_for


def written(c: kvstore.Client) -> bool:
    """Whether nothing waits to be written to disk: no queued write, none in flight, no checksum being taken (a
    chunk whose checksum is being taken is not queued for its write yet)."""
    stats = c.stats()
    disk, sums = stats["disk"], stats.get("integrity", {}).get("sums_pending", 0)
    return disk["write_queue_chunks"] == 0 and disk["writes_in_flight"] == 0 and sums == 0


def wait_written(c: kvstore.Client, timeout: float = 30.0) -> None:
    """Wait until ``written(c)``; AssertionError after ``timeout`` seconds."""
    assert wait_for(lambda: written(c), timeout, interval=0.02), "disk writes did not finish"
