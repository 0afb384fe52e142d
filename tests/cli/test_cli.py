"""The command line: clear one-line errors and exit codes, stats output, one daemon per socket."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import wait_for
from harness.daemons import run_cli, sandbox_env, short_tempdir

import kvstore


def kvstore_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("args, needle", [
    (["serve", "--host-mem", "-5MiB"], "--host-mem: a size must not be negative, got '-5MiB'"),
    (["serve", "--host-mem", "10PiB"], "--host-mem: 10.0 PiB does not fit in memory"),
    (["stats", "--count", "3"], "--count only applies with --watch"),
    (["stats", "--interval", "2"], "--interval only applies with --watch"),
    (["scrub", "--rate", "abc"], "argument --rate: cannot read 'abc' as a size"),
    (["scrub", "--cancel", "--rate", "1MiB"], "--cancel stops passes and starts none"),
    (["simulate", "trace.jsonl", "--host-mem", "1GiB", "--chunk-bytes", "1MiB", "--out", "x.png"],
     "--out names the --sweep plot; add --sweep"),
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
    assert f"{cfg}: host_mem: expected a size" in one_line_error(kvstore_cli("serve", "--config", str(cfg)))
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


# -- scrub: progress, and a pass that ends with the command that started it --------------------------------------

def _slow_scrub_daemon(start_daemon):
    """A daemon holding 8 chunks of 4 KiB: at --rate 1KiB a pass takes half a minute or more."""
    d = start_daemon()
    with d.client(namespace="scrub", chunk_tokens=4) as c:
        c.put(c.chunk_keys(list(range(32))), [os.urandom(4096) for _ in range(8)])
    return d


def _scrubs_running(d) -> int:
    with d.client(namespace="scrub-watch", use_arena=False) as c:
        return int(c.stats()["scrub"]["running"])


def _default_sigint() -> None:
    """In the child: SIGINT as a terminal gives it, whatever the test runner inherited (a background job of a
    shell without job control starts with SIGINT ignored, and so would the command, without Ctrl-C's handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _scrub_proc(d, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kvstore", "scrub", "--socket", d.socket_path, "--rate", "1KiB",
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=sandbox_env(d.workdir), preexec_fn=_default_sigint)


def test_scrub_timeout_stops_the_pass_in_the_daemon_and_shows_progress(start_daemon):
    d = _slow_scrub_daemon(start_daemon)
    result = kvstore_cli("scrub", "--socket", d.socket_path, "--rate", "1KiB", "--timeout", "2", "--json")
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("scrub: ") and " of 8 chunks" in lines[0] and "/s" in lines[0], lines
    assert lines[-1].startswith("kvstore: error: the scrub was stopped at --timeout 2s"), lines
    report = json.loads(result.stdout)
    assert report["cancelled"] is True and report["checked"] < 16
    assert _scrubs_running(d) == 0        # stopped before the command returned, not hours later


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_scrub_stops_its_pass(start_daemon, sig, code):
    d = _slow_scrub_daemon(start_daemon)
    proc = _scrub_proc(d)
    try:
        assert wait_for(lambda: _scrubs_running(d) == 1, timeout=30)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "the daemon stopped the pass" in err
    assert _scrubs_running(d) == 0


def test_a_killed_scrub_command_has_its_pass_stopped_by_the_daemon(start_daemon):
    d = _slow_scrub_daemon(start_daemon)
    proc = _scrub_proc(d)
    try:
        assert wait_for(lambda: _scrubs_running(d) == 1, timeout=30)
        proc.kill()   # no chance to cancel: the daemon notices its client stopped asking
        proc.wait(30)
    finally:
        proc.kill()
    assert wait_for(lambda: _scrubs_running(d) == 0, timeout=60)
    assert "scrub_orphaned" in d.log()


def test_scrub_cancel_stops_every_pass_and_its_command_says_so(start_daemon):
    d = _slow_scrub_daemon(start_daemon)
    proc = _scrub_proc(d)
    try:
        assert wait_for(lambda: _scrubs_running(d) == 1, timeout=30)
        result = kvstore_cli("scrub", "--socket", d.socket_path, "--cancel")
        assert result.returncode == 0 and result.stdout.strip() == "stopped 1 scrub pass", result
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1 and "stopped by kvstore scrub --cancel" in err, err
    assert _scrubs_running(d) == 0
    again = kvstore_cli("scrub", "--socket", d.socket_path, "--cancel")
    assert again.stdout.strip() == "no scrub pass started by a client was running"


def test_scrub_rate_error_names_the_flag_once():
    line = one_line_error(kvstore_cli("scrub", "--rate", "abc"))
    assert line.count("--rate") == 1, line


def test_config_file_errors_name_the_key_and_the_file(tmp_path):
    cfg = tmp_path / "kv.toml"
    cfg.write_text("host_mem = 131072\n")
    assert one_line_error(kvstore_cli("serve", "--config", str(cfg))) == (
        f"kvstore: error: {cfg}: host_mem: 131072 bytes is too small; give at least 1MiB")
    cfg.write_text('host-mem = "lots"\n')
    assert one_line_error(kvstore_cli("serve", "--config", str(cfg))).startswith(
        f"kvstore: error: {cfg}: host-mem: cannot read 'lots' as a size")
    cfg.write_text('host_mem = "64MiB"\nlease_ttl = "-1s"\n')
    assert f"{cfg}: lease_ttl:" in one_line_error(kvstore_cli("serve", "--config", str(cfg)))
    # a flag given over the file's value is what an error names
    assert one_line_error(kvstore_cli("serve", "--config", str(cfg), "--lease-ttl", "x")).startswith(
        "kvstore: error: --lease-ttl: cannot read 'x'")


def test_relative_paths_in_a_config_file_are_read_beside_the_file(tmp_path, monkeypatch):
    from kvstore.config import build_config

    folder = tmp_path / "etc"
    folder.mkdir()
    cfg = folder / "kv.toml"
    cfg.write_text('socket = "run/kv.sock"\ndisk_dir = "chunks"\nhost_mem = "64MiB"\n')
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = build_config({}, os.path.relpath(cfg))
    assert config.socket == str(folder / "run" / "kv.sock") and config.disk_dir == str(folder / "chunks")
    flagged = build_config({"disk_dir": "mine"}, str(cfg))   # a flag: against the working directory
    assert flagged.disk_dir == str(elsewhere / "mine")


def test_watch_into_a_file_writes_each_frame_and_stops_cleanly_on_sigterm(daemon, tmp_path):
    with daemon.client(namespace="w") as c:
        c.put(c.chunk_keys(list(range(256))), [b"x" * 4096])
    out = tmp_path / "watch.txt"
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "kvstore", "stats", "--socket", daemon.socket_path, "--watch",
                                 "--interval", "0.2"], stdout=f, stderr=subprocess.PIPE, text=True,
                                env=sandbox_env(daemon.workdir))
    try:
        assert wait_for(lambda: out.read_text().count("hit rate (tokens)") >= 2, timeout=30), out.read_text()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and err == "", err


def test_stats_and_watch_show_a_tier_use_the_same_way(daemon):
    from kvstore.cli.watch import percent

    with daemon.client(namespace="w") as c:
        c.put(c.chunk_keys(list(range(256))), [b"x" * (1 << 20)])
        host = c.stats()["tiers"]["host"]
    shown = percent(host["used_bytes"], host["capacity_bytes"])
    assert shown.endswith(" %") and shown != "0.0 %"
    table = kvstore_cli("stats", "--socket", daemon.socket_path).stdout
    watched = subprocess.run([sys.executable, "-m", "kvstore", "stats", "--socket", daemon.socket_path, "--watch",
                              "--count", "1"], capture_output=True, text=True, timeout=60,
                             env=sandbox_env(daemon.workdir)).stdout
    for text in (table, watched):
        row = next(line for line in text.splitlines() if " host " in line)
        assert shown in row, (shown, row)


def _watch_once(d) -> str:
    """One ``kvstore stats --watch`` frame, piped (not a terminal)."""
    return subprocess.run([sys.executable, "-m", "kvstore", "stats", "--socket", d.socket_path, "--watch",
                           "--count", "1"], capture_output=True, text=True, timeout=60,
                          env=sandbox_env(d.workdir), check=True).stdout


def _row(text: str, label: str) -> str:
    return next(line for line in text.splitlines() if label in line)


def test_stats_does_not_count_itself_as_a_client(daemon):
    with daemon.client(namespace="one") as c:
        clients = c.stats()["sessions"]   # this test's clients, which it holds open
        shown = _row(kvstore_cli("stats", "--socket", daemon.socket_path).stdout, "clients").split("│")[2].strip()
        watched = _row(_watch_once(daemon), "leases / reservations / clients").split("│")[3].strip()
    assert shown == str(clients) and watched == f"0 / 0 / {clients}"


def test_watch_since_start_column_is_the_rate_over_the_uptime(daemon):
    import io

    from rich.console import Console

    from kvstore.cli.watch import Sample, render
    from kvstore.units import format_size

    with daemon.client(namespace="w") as c:
        c.put(c.chunk_keys(list(range(256 * 4))), [b"x" * (1 << 20)] * 4)
        stats = c.stats()
    stats["uptime_s"] = 1000.0   # the column must be the total over the uptime, whatever the uptime
    put = stats["counters"]["put_bytes"]
    assert put >= 4 << 20
    out = io.StringIO()
    Console(file=out, width=200).print(render(stats, None, Sample.of(stats), daemon.address))
    assert _row(out.getvalue(), "bytes in/s (put)").split("│")[3].strip() == format_size(int(put / 1000.0))
    assert _row(out.getvalue(), "hit tokens/s").split("│")[3].strip() == str(int(stats["hit_tokens"] / 1000.0))


def _tenants_daemon(start_daemon, tmp_path, *flags: str):
    cfg = tmp_path / "kv.toml"
    cfg.write_text('[tenants.interactive-chat]\nnamespaces = ["chat*"]\n[tenants.interactive-chat.dram]\n'
                   'guaranteed = "8MiB"\n')
    return start_daemon("--config", str(cfg), *flags)


def test_piped_stats_show_whole_tenant_names_and_only_the_tiers_that_run(start_daemon, tmp_path):
    d = _tenants_daemon(start_daemon, tmp_path, "--disk-size", "0")
    for text in (kvstore_cli("stats", "--socket", d.socket_path).stdout, _watch_once(d)):
        tenants = text[text.index("tenants"):]
        assert "…" not in tenants, tenants
        assert "interactive-chat" in tenants and "default" in tenants and "evicted by others" in tenants
        tiers = {line.split("│")[2].strip() for line in tenants.splitlines() if line.startswith("│")}
        assert tiers == {"dram"}, tenants


def test_stats_show_the_disk_rows_of_tenants_when_the_disk_tier_runs(start_daemon, tmp_path):
    d = _tenants_daemon(start_daemon, tmp_path)
    tenants = kvstore_cli("stats", "--socket", d.socket_path).stdout.split("tenants", 1)[1]
    tiers = {line.split("│")[2].strip() for line in tenants.splitlines() if line.startswith("│")}
    assert tiers == {"dram", "disk"}, tenants


@pytest.mark.parametrize("extra", [[], ["--replay-endpoint", "REPLAY", "--from", "0"], ["--snapshot",
                                                                                      "--replay-endpoint", "REPLAY"]])
def test_events_on_a_dead_endpoint_give_up_in_one_line(extra):
    where = short_tempdir()
    dead = "ipc://" + os.path.join(where, "ev.sock")
    args = [a.replace("REPLAY", "ipc://" + os.path.join(where, "evr.sock")) for a in extra]
    result = kvstore_cli("events", "--endpoint", dead, *args, "--timeout", "0.5")
    assert result.returncode == 1 and result.stdout == ""
    assert f"--endpoint: nothing accepted a connection at {dead} within 0.5s" in one_line_error(result)


def test_events_with_a_dead_replay_endpoint_give_up_in_one_line(start_daemon):
    workdir = short_tempdir()
    pub = "ipc://" + os.path.join(workdir, "ev.sock")
    d = start_daemon("--events-endpoint", pub, workdir=workdir)
    dead = "ipc://" + os.path.join(d.workdir, "no-replay.sock")
    result = kvstore_cli("events", "--endpoint", pub, "--replay-endpoint", dead, "--from", "0", "--timeout", "0.5")
    assert result.returncode == 1 and result.stdout == ""
    assert f"--replay-endpoint: nothing accepted a connection at {dead}" in one_line_error(result)


def test_events_timeout_must_be_positive():
    result = kvstore_cli("events", "--endpoint", "ipc:///tmp/x.sock", "--timeout", "0")
    assert result.returncode == 2 and "--timeout: must be positive" in one_line_error(result)


def test_a_clean_stop_removes_the_events_socket_files_it_made_and_no_other(start_daemon):
    workdir = short_tempdir()
    pub, replay = os.path.join(workdir, "ev.sock"), os.path.join(workdir, "evr.sock")
    d = start_daemon("--events-endpoint", "ipc://" + pub, "--events-replay-endpoint", "ipc://" + replay,
                     workdir=workdir)
    assert os.path.exists(pub) and os.path.exists(replay)
    os.unlink(replay)   # another program's file now stands where the daemon's was
    with open(replay, "w") as f:
        f.write("not the daemon's")
    assert d.stop() == 0
    assert not os.path.exists(pub)
    assert open(replay).read() == "not the daemon's"


def test_a_bare_clean_frees_only_the_default_sockets_leftovers(start_daemon):
    from kvstore.mapped.arena import arena_path_for

    d = start_daemon("--adopt")
    with d.client(namespace="t") as c:
        c.put(c.chunk_keys(list(range(256))), [b"x" * 4096])
    assert d.stop() == 0
    kept = arena_path_for(d.socket_path)
    assert os.path.exists(kept)   # kept for a warm restart on its socket, which is not the default one
    bare = kvstore_cli("clean")
    assert bare.returncode == 0 and kept not in bare.stdout and os.path.exists(kept), bare.stdout
    assert "nothing to clean for this socket" in bare.stdout or "freed" in bare.stdout
    listed = kvstore_cli("clean", "--all", "--dry-run")   # every socket's, only listed: other users' tests run here
    assert listed.returncode == 0 and f"would free  {kept}" in listed.stdout and os.path.exists(kept)
    own = kvstore_cli("clean", "--socket", d.socket_path)
    assert own.returncode == 0 and f"freed {kept}" in own.stdout and not os.path.exists(kept)


def test_clean_all_and_socket_are_one_or_the_other():
    result = kvstore_cli("clean", "--all", "--socket", "/tmp/x.sock")
    assert result.returncode == 2 and "--all frees the files of every socket" in one_line_error(result)


def test_the_example_systemd_config_starts_on_a_small_disk():
    from pathlib import Path

    from harness.daemons import Daemons

    from kvstore.config import build_config

    example = Path(__file__).resolve().parents[2] / "systemd" / "kvstore.toml"
    assert build_config({}, str(example)).disk_size < 0   # auto: sized from the free space, never refused for it
    with Daemons(test_sizes=False) as daemons:   # the example's own sizes; only its paths and port moved
        d = daemons.start("--config", str(example), "--metrics-port", "0")
        with d.client(namespace="t") as c:
            assert c.stats()["tiers"]["disk"]["capacity_bytes"] > 0


def test_a_bare_kvstore_prints_its_help_as_a_usage_error():
    result = kvstore_cli()
    assert result.returncode == 2 and result.stdout == ""   # no command: a usage error, as argparse's are
    assert result.stderr.startswith("usage: kvstore") and "serve" in result.stderr and "clean" in result.stderr
