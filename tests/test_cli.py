"""The command line: clear one-line errors and exit codes, stats output, one daemon per socket."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

import kvstore
from daemons import run_cli, sandbox_env, short_tempdir


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


@pytest.mark.parametrize("args, needle", [
    (["stats", "--address", "foo://bar"], "--address: expected ipc:///path/to/kvstore.sock or tcp://HOST:PORT"),
    (["stats", "--address", "/tmp/x.sock"], "for a socket path use --socket /tmp/x.sock"),
    (["stats", "--address", "tcp://no-port"], "--address: 'tcp://no-port' is not a valid address"),
    (["stats", "--timeout", "0"], "--timeout: must be positive"),
    (["stats", "--timeout", "-1"], "--timeout: must be positive"),
    (["stats", "--address", "tcp://127.0.0.1:1", "--socket", "/tmp/x.sock"], "give one"),
])
def test_bad_stats_flags_give_one_clear_line(args, needle):
    result = kvstore_cli(*args)
    assert result.returncode == 2 and needle in one_line_error(result)


def test_stats_timeout_is_honoured_against_a_running_daemon(daemon):
    result = kvstore_cli("stats", "--socket", daemon.socket_path, "--timeout", "0.5", "--json")
    assert result.returncode == 0, result.stderr


def test_version():
    result = kvstore_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"kvstore {kvstore.__version__}"


def test_output_into_a_closed_pipe_is_quiet(tmp_path):
    """`kvstore keygen | head -1`: the reader leaves early; no BrokenPipeError traceback, and the keys exist."""
    proc = subprocess.Popen([sys.executable, "-m", "kvstore", "keygen", "--dir", str(tmp_path / "k")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=sandbox_env(str(tmp_path)))
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(30) == 141 and err == ""
    assert (tmp_path / "k" / "server.key").exists()


def test_every_subcommand_has_a_description_and_every_flag_help():
    from kvstore.cli.main import build_parser

    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name}: description" for name, p in subcommands.choices.items() if not p.description]
    for name, p in [("kvstore", parser), *subcommands.choices.items()]:
        for action in p._actions:
            if not isinstance(action, argparse._HelpAction) and action.help in (None, "", argparse.SUPPRESS):
                missing.append(f"{name}: {'/'.join(action.option_strings) or action.dest}")
    assert not missing, missing
