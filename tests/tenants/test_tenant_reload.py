"""A real daemon reloads its tenants table without a restart (``kvstore reload``, SIGHUP): budgets, access and
the shared index follow the new table at once; a bad table is refused in one line and the old one stays."""

from __future__ import annotations

import os
import signal

import pytest

import kvstore
from conftest import wait_for
from harness.daemons import run_cli

pytestmark = pytest.mark.integration

CHUNK = 1_000_000
STRANGER = os.getuid() + 54321   # a uid that is not ours
SMALL = """
[tenants.small]
namespaces = ["small:"]
[tenants.small.dram]
ceiling = "{ceiling}"
"""
RESTRICTED = f"""
[tenants.team]
namespaces = ["team:"]
uids = [{STRANGER}]
"""


def _keys(n: int) -> list[bytes]:
    return [os.urandom(16) for _ in range(n)]


def _start(start_daemon, tmp_path, table: str):
    config = tmp_path / "kvstore.toml"
    config.write_text(table)
    return config, start_daemon("--config", str(config), "--host-mem", "16MiB", "--disk-size", "0")


def _reload(daemon, *flags: str):
    return run_cli("reload", "--socket", daemon.socket_path, *flags, timeout=60)


def _ceiling(client: kvstore.Client) -> int:
    return client.stats()["tenants"]["small"]["tiers"]["dram"]["ceiling"]


def test_reload_changes_a_budget_and_stats_show_it(start_daemon, tmp_path):
    config, daemon = _start(start_daemon, tmp_path, SMALL.format(ceiling="3MiB"))
    with daemon.client(namespace="small:a") as small:
        assert _ceiling(small) == 3 << 20
        config.write_text('lease_ttl = "42s"\n' + SMALL.format(ceiling="5MiB"))
        done = _reload(daemon)
        assert done.returncode == 0, done.stderr
        assert "reloaded: tenants small, default" in done.stdout
        assert "needs a restart): lease_ttl" in done.stdout
        assert _ceiling(small) == 5 << 20
        for _ in range(5):   # 5 MiB now fit where 3 did before
            small.put(_keys(1), [b"s" * CHUNK])
        assert small.stats()["tenants"]["small"]["dram_bytes"] == 5 * CHUNK


def test_a_bad_table_is_refused_and_the_old_one_stays_in_force(start_daemon, tmp_path):
    config, daemon = _start(start_daemon, tmp_path, SMALL.format(ceiling="3MiB"))
    config.write_text(SMALL.format(ceiling="3MiB") + '[tenants.default.dram]\nguaranteed = "64MiB"\n')
    done = _reload(daemon)
    assert done.returncode == 1
    assert done.stderr.startswith(f"kvstore: error: reload refused: {config}: tenants: the dram guarantees add up "
                                  f"to 64.0 MiB (default 64.0 MiB) but the dram tier holds ")
    assert done.stderr.endswith("; lower them or grow the tier; the tenants table in force is kept\n")
    assert done.stderr.count("\n") == 1
    assert "reload_refused" in daemon.log()
    with daemon.client(namespace="small:a") as small:
        assert _ceiling(small) == 3 << 20
        with pytest.raises(kvstore.StoreFullError, match=r"tenant small cannot take this put: .* the tenant's whole "
                                                         r"dram ceiling \(3145728 bytes"):
            small.put(_keys(4), [b"s" * CHUNK] * 4)


def test_sighup_reloads(start_daemon, tmp_path):
    config, daemon = _start(start_daemon, tmp_path, SMALL.format(ceiling="3MiB"))
    config.write_text(SMALL.format(ceiling="7MiB"))
    daemon.proc.send_signal(signal.SIGHUP)
    with daemon.client(namespace="small:a") as small:
        assert wait_for(lambda: _ceiling(small) == 7 << 20, 20), daemon.log()
    assert "tenants_reloaded" in daemon.log()


def test_a_newly_restricted_namespace_leaves_the_shared_index_and_refuses_us(start_daemon, tmp_path):
    config, daemon = _start(start_daemon, tmp_path, SMALL.format(ceiling="3MiB"))
    keys = _keys(2)
    with daemon.client(namespace="team:a") as team:
        team.put(keys, [b"t" * 4096] * 2)
        assert team.lookup(keys) == 2
        assert team.lookup_tiers(keys).count == 2
        config.write_text(RESTRICTED)
        done = _reload(daemon, "--json")
        assert done.returncode == 0, done.stderr
        # This session mapped the shared index while the namespace was open: the chunks left it, so its own
        # lookups (answered from shared memory where the index lists a key) miss too.
        assert team.lookup(keys) == 0
        with pytest.raises(kvstore.PermissionDeniedError, match="tenant team"):
            team.put(_keys(1), [b"t" * 4096])
    with daemon.client(namespace="team:a") as fresh:
        assert fresh.lookup(keys) == 0
    config.write_text(SMALL.format(ceiling="3MiB"))
    assert _reload(daemon).returncode == 0
    with daemon.client(namespace="team:a") as reopened:   # open again: listed again, readable by all
        assert reopened.lookup(keys) == 2


def test_stats_and_watch_show_each_tenant(start_daemon, tmp_path):
    _config, daemon = _start(start_daemon, tmp_path, SMALL.format(ceiling="3MiB"))
    keys = _keys(2)
    with daemon.client(namespace="small:a", chunk_tokens=16) as small:
        small.put(keys, [b"s" * CHUNK] * 2)
        assert small.lookup(keys + _keys(2)) == 2
        row = small.stats()["tenants"]["small"]
    assert (row["lookup_tokens"], row["hit_tokens"]) == (64, 32)
    for flags in ((), ("--watch", "--count", "1", "--interval", "0.1")):
        done = run_cli("stats", "--socket", daemon.socket_path, *flags, env={"COLUMNS": "200"}, timeout=60)
        assert done.returncode == 0, done.stderr
        line = next(x for x in done.stdout.splitlines() if "│ small" in x)
        cells = [c.strip() for c in line.split("│")[1:-1]]
        assert cells == ["small", "dram", "1.9 MiB", "0 B", "3.0 MiB", "63.6 %", "0", "0", "50.0 %"], line
