"""The command line: clear one-line errors and exit codes, stats output, one daemon per socket."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from daemons import run_cli, short_tempdir


def kvstore_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("args, needle", [
    (["serve", "--no-such-flag"], "unrecognized arguments"),
    (["serve", "--host-mem", "lots"], "--host-mem"),
    (["serve", "--host-mem", "100TiB"], "does not fit in memory"),
    (["serve", "--lease-ttl", "-3"], "--lease-ttl"),
    (["serve", "--tcp", "localhost"], "HOST:PORT"),
    (["serve", "--socket", "/proc/kvstore/x.sock"], "--socket"),
    (["serve", "--socket", "/tmp/" + "x" * 120], "at most 107"),
    (["serve", "--config", "/nonexistent.toml"], "does not exist"),
])
def test_bad_flags_give_one_clear_line(args, needle):
    result = kvstore_cli(*args)
    assert result.returncode == 2
    assert needle in one_line_error(result)


def test_bad_config_key_is_named(tmp_path):
    cfg = tmp_path / "kv.toml"
    cfg.write_text('host_mem = "64MiB"\nhost_memory = "1GiB"\n')
    result = kvstore_cli("serve", "--config", str(cfg))
    assert result.returncode == 2 and "unknown key 'host_memory'" in one_line_error(result)
    cfg.write_text('host_mem = [1, 2]\n')
    assert "--host-mem" in one_line_error(kvstore_cli("serve", "--config", str(cfg)))
    cfg.write_text('host_mem = "64MiB\n')
    assert "not valid TOML" in one_line_error(kvstore_cli("serve", "--config", str(cfg)))


def test_config_file_and_flag_precedence(start_daemon, tmp_path):
    cfg = tmp_path / "kv.toml"
    cfg.write_text('host-mem = "32MiB"\nlease_ttl = "5s"\n')
    d = start_daemon("--config", str(cfg), "--host-mem", "16MiB")
    stats = json.loads(kvstore_cli("stats", "--socket", d.socket_path, "--json").stdout)
    assert stats["tiers"]["host"]["capacity_bytes"] == 16 << 20


def test_stats_json_and_table(daemon):
    with daemon.client(namespace="t") as c:
        c.put(c.chunk_keys(list(range(512))), [b"a" * 10_000, b"b" * 10_000])
    result = kvstore_cli("stats", "--socket", daemon.socket_path, "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    host = stats["tiers"]["host"]
    assert host["capacity_bytes"] == 64 << 20 and host["chunks"] == 2 and host["used_bytes"] >= 20_000
    table = kvstore_cli("stats", "--socket", daemon.socket_path)
    assert table.returncode == 0 and "host" in table.stdout and "hit" in table.stdout


def test_stats_without_daemon_fails_in_one_line():
    result = kvstore_cli("stats", "--socket", os.path.join(short_tempdir(), "none.sock"), "--timeout", "0.5")
    assert result.returncode == 1
    assert "no kvstore daemon" in one_line_error(result)


def test_second_daemon_on_same_socket_refuses(daemon):
    result = kvstore_cli("serve", "--socket", daemon.socket_path, "--host-mem", "16MiB")
    assert result.returncode == 2
    assert "already serving" in one_line_error(result)
    with daemon.client() as c:
        c.ping()


def test_sigterm_exits_zero_and_cleans_up(daemon):
    with daemon.client() as c:
        arena = c.server_info["arena"]["path"]
    assert os.path.exists(arena) and os.path.exists(daemon.socket_path)
    assert oct(os.stat(arena).st_mode & 0o777) == "0o600"
    assert oct(os.stat(daemon.socket_path).st_mode & 0o077) == "0o0"
    assert daemon.stop() == 0
    assert not os.path.exists(arena) and not os.path.exists(daemon.socket_path)


def test_stale_socket_and_arena_are_replaced_after_a_crash(daemon):
    daemon.kill()
    assert os.path.exists(daemon.socket_path)  # left behind by kill -9
    daemon.start()
    with daemon.client(namespace="t") as c:
        keys = c.chunk_keys(list(range(256)))
        c.put(keys, [b"x" * 100])
        assert c.lookup(keys) == 1


@pytest.mark.parametrize("command", ["serve", "stats", "alerts", "keygen", None])
def test_help_works_for_every_command(command):
    args = [command, "--help"] if command else ["--help"]
    result = kvstore_cli(*args)
    if command == "keygen" and "invalid choice" in result.stderr:
        pytest.skip("keygen not present")
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout
