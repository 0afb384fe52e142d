"""Load: many client processes over ipc:// and tcp:// at once, no errors, no wrong bytes, a flat daemon heap.

A short run (8 processes for 10 s); ``bench/load.py`` runs 32 processes for minutes and reports throughput.
"""

from __future__ import annotations

from harness.workload import free_port, run_load

PROCESSES = 8
SECONDS = 10.0
HEAP_SLACK = 24 << 20  # allocator noise; a leak per request would grow far past this over thousands of requests


def test_mixed_load_over_ipc_and_tcp(start_daemon):
    port = free_port()
    d = start_daemon("--host-mem", "48MiB", "--tcp", f"127.0.0.1:{port}")
    addresses = [d.address if i % 2 == 0 else f"tcp://127.0.0.1:{port}" for i in range(PROCESSES)]
    report = run_load(addresses, SECONDS, d.proc.pid, timeout=30)
    t = report["total"]
    assert t["errors"] == 0 and t["corrupt"] == 0, report
    assert t["chunks_read"] > 0 and t["chunks_written"] > 0, report
    assert report["daemon_rss_growth_after_warmup_bytes"] < HEAP_SLACK, report["daemon_rss_anon_bytes"]
    with d.client(namespace="check", use_arena=False) as c:
        s = c.stats()
        # Error replies are only the back-pressure the clients saw (StoreFullError: "disk writes are behind").
        assert s["leases"] == 0 and s["reservations"] == 0 and s["errors"] == t["store_full"], s
    print({k: v for k, v in report.items() if k != "daemon_rss_anon_bytes"})
