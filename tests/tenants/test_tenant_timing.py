"""A lookup of another tenant's chunk answers what a miss answers, over the socket (a real daemon). What each
costs, the two latency distributions side by side, is measured by ``bench/tenant_timing.py`` (a timing claim: a
benchmark's, not a test's on a shared machine)."""

from __future__ import annotations

import os

import pytest

from harness.daemons import run_cli

pytestmark = pytest.mark.integration

CHAIN = 8
OPEN = '[tenants.theirs]\nnamespaces = ["theirs:"]\n'
RESTRICTED = OPEN + f"uids = [{os.getuid() + 54321}]\n"


def test_a_forbidden_lookup_answers_what_a_miss_answers(start_daemon, tmp_path):
    config = tmp_path / "kvstore.toml"
    config.write_text(OPEN)
    daemon = start_daemon("--config", str(config), "--host-mem", "16MiB", "--disk-size", "0")
    theirs = [os.urandom(16) for _ in range(CHAIN)]
    with daemon.client(namespace="theirs:a") as owner:
        owner.put(theirs, [b"t" * 4096] * CHAIN)
    config.write_text(RESTRICTED)   # now theirs: is closed to us
    assert run_cli("reload", "--socket", daemon.socket_path, timeout=60).returncode == 0
    with daemon.client(namespace="mine", use_arena=False) as mine:   # every lookup goes to the daemon
        absent = [os.urandom(16) for _ in range(CHAIN)]
        assert mine.lookup(theirs) == mine.lookup(absent) == 0
        assert mine.lookup_tiers(theirs, promote=False) == mine.lookup_tiers(absent, promote=False)
        assert mine.lookup_tiers(theirs).tiers == mine.lookup_tiers(absent).tiers == {}
