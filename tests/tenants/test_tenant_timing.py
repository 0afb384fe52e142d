"""A lookup of another tenant's chunk costs what a miss costs: the two latency distributions overlap (a real
daemon, lookups over the socket, interleaved)."""

from __future__ import annotations

import os
import statistics
import time

import pytest

from support.daemons import run_cli

pytestmark = pytest.mark.integration

LOOKUPS = 300
CHAIN = 8
OPEN = '[tenants.theirs]\nnamespaces = ["theirs:"]\n'
RESTRICTED = OPEN + f"uids = [{os.getuid() + 54321}]\n"


def _deciles(samples: list[float]) -> tuple[float, float, float]:
    cuts = statistics.quantiles(samples, n=10, method="inclusive")
    return cuts[0], statistics.median(samples), cuts[-1]


def test_a_forbidden_lookup_costs_what_a_miss_costs(start_daemon, tmp_path):
    config = tmp_path / "kvstore.toml"
    config.write_text(OPEN)
    daemon = start_daemon("--config", str(config), "--host-mem", "16MiB", "--disk-size", "0")
    theirs = [os.urandom(16) for _ in range(CHAIN)]
    with daemon.client(namespace="theirs:a") as owner:
        owner.put(theirs, [b"t" * 4096] * CHAIN)
    config.write_text(RESTRICTED)   # now theirs: is closed to us
    assert run_cli("reload", "--socket", daemon.socket_path, timeout=60).returncode == 0
    forbidden: list[float] = []
    missed: list[float] = []
    with daemon.client(namespace="mine", use_arena=False) as mine:   # every lookup goes to the daemon
        for i in range(LOOKUPS + 30):   # the first 30 rounds warm up
            absent = [os.urandom(16) for _ in range(CHAIN)]
            for keys, into in ((theirs, forbidden), (absent, missed))[:: 1 if i % 2 else -1]:
                t0 = time.perf_counter()
                assert mine.lookup(keys) == 0
                if i >= 30:
                    into.append(time.perf_counter() - t0)
    f10, f50, f90 = _deciles(forbidden)
    m10, m50, m90 = _deciles(missed)
    shown = f"forbidden p10/p50/p90 {f10:.2e}/{f50:.2e}/{f90:.2e}s, miss {m10:.2e}/{m50:.2e}/{m90:.2e}s"
    assert m10 <= f50 <= m90 and f10 <= m50 <= f90, shown
    assert abs(f50 - m50) <= 0.2 * max(f50, m50), shown
