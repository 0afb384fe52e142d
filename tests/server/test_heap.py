"""The daemon's heap: start-up's objects frozen out of the garbage collector's walks, and its pauses reported."""

from __future__ import annotations

import gc
import os

from kvstore.metrics.collector import family_of
from kvstore.metrics.definitions import flatten, metric
from kvstore.server.lifecycle.heap import HeapWatch


def test_a_heap_watch_times_each_collection_by_generation_until_uninstalled():
    watch = HeapWatch()
    watch.install()
    watch.install()                                   # idempotent: one callback, each collection counted once
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        watch.uninstall()
    seen = watch.stats()["generations"]
    assert seen["2"]["collections"] == 1 and seen["0"]["collections"] >= 1
    assert 0 < seen["2"]["longest_pause_seconds"] <= seen["2"]["pause_seconds"]
    gc.collect(2)
    assert watch.stats()["generations"]["2"]["collections"] == 1   # no longer installed
    watch.uninstall()                                 # idempotent too


def test_the_daemon_freezes_what_start_up_made_and_reports_its_collections(client):
    stats = client.stats()
    assert stats["gc"]["frozen_objects"] > 1000       # modules, classes, functions, the config and the tiers
    keys = [os.urandom(16) for _ in range(200)]
    client.put(keys, [b"x" * 4096] * len(keys))
    stats = client.stats()
    assert set(stats["gc"]["generations"]) == {"0", "1", "2"}
    assert stats["gc"]["generations"]["0"]["collections"] >= 1   # serving made objects, so young collections ran
    samples = family_of(metric("gc_collections"), list(flatten(stats))).samples
    assert {s.labels["generation"] for s in samples} == {"0", "1", "2"}
