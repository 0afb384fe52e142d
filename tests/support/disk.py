"""Waiting on a daemon's disk tier."""

from __future__ import annotations

import time

import kvstore


def wait_written(c: kvstore.Client, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = c.stats()
        disk, sums = stats["disk"], stats.get("integrity", {}).get("sums_pending", 0)
        if disk["write_queue_chunks"] == 0 and disk["writes_in_flight"] == 0 and sums == 0:
            return   # (a chunk whose checksum is being taken is not queued for its write yet)
        time.sleep(0.02)
    raise AssertionError("disk writes did not finish")
