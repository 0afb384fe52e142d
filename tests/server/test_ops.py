"""Operations against a real daemon: /metrics, stats --watch, readiness notification, graceful stop, systemd."""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import kvstore
from kvstore.config import build_config
from kvstore.metrics.collector import unmapped_paths
from kvstore.metrics.definitions import METRICS, exported_series
from kvstore.protocol.wire import Op

from conftest import wait_for
from harness.daemons import sandbox_env
from harness.servers import require
from support.paths import ROOT
from support.scrape import free_port, scrape, value

REPO = ROOT


def wait_for_log(d, needle: str, timeout: float = 20) -> None:
    assert wait_for(lambda: needle in d.log() or d.proc.poll() is not None, timeout), d.log()
    assert needle in d.log(), d.log()


def test_metrics_endpoint_counts_real_requests(start_daemon):
    port = free_port()
    d = start_daemon("--metrics-port", str(port))
    with d.client(namespace="m") as c:
        keys = c.chunk_keys(list(range(4 * 256)))
        assert c.put(keys[:2], [b"a" * 1000, b"b" * 1000]) == 2
        assert c.lookup(keys) == 2                      # asked 4 chunks, found 2
        with c.get(keys[:2]) as views:
            assert len(views) == 2
            during = scrape(port)
        after = scrape(port)
        stats = c.stats()
    assert value(after, "kvstore_lookups_total") == 1
    assert value(after, "kvstore_lookup_tokens_total") == 4 * 256
    assert value(after, "kvstore_hit_tokens_total") == 2 * 256
    assert value(after, "kvstore_put_bytes_total") == 2000 and value(after, "kvstore_get_chunks_total") == 2
    assert value(after, "kvstore_tier_capacity_bytes", tier="host") == 64 << 20
    assert value(after, "kvstore_tier_chunks", tier="host") == 2
    assert value(after, "kvstore_tier_used_bytes", tier="host") >= 2000
    assert value(during, "kvstore_leases_active") == 1 and value(after, "kvstore_leases_active") == 0
    assert value(after, "kvstore_clients_connected") >= 1
    # a local client answers the lookup from the shared index and tells the daemon in a LOOKUP_SEEN note
    assert value(after, "kvstore_request_duration_seconds_count", op="lookup") \
        + value(after, "kvstore_request_duration_seconds_count", op="lookup_seen") == 1
    # the put is one reserve (+ commit), or the first credit put: one asking for a credit, one putting into it
    assert (value(after, "kvstore_request_duration_seconds_count", op="reserve"),
            value(after, "kvstore_request_duration_seconds_count", op="credit_put")) in {(1, 0), (0, 2)}
    assert value(after, "kvstore_request_duration_seconds_count", op="get") == 1
    # nothing is exported that is not defined, every definition is exported, every stats number has a metric
    names = {n for n in after if n.startswith("kvstore_")}
    assert names <= exported_series()
    assert {m.name + ("_total" if m.kind == "counter" else "_count" if m.kind == "histogram" else "")
            for m in METRICS if m.kind == "histogram" or after.get(m.sample_name)} <= names
    assert unmapped_paths(stats) == []


def test_metrics_port_in_use_is_one_clear_line(start_daemon):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        d = start_daemon("--metrics-port", str(busy.getsockname()[1]), wait=False)
        assert d.proc.wait(30) == 2
    assert "--metrics-port: cannot listen" in d.log()
    assert not os.path.exists(d.socket_path)


def _watch(d, *extra: str, **kwargs) -> list[str]:
    return [sys.executable, "-m", "kvstore", "stats", "--socket", d.socket_path, "--watch",
            "--interval", "0.2", *extra]


def test_stats_watch_shows_rates_and_hit_rate(daemon):
    with daemon.client(namespace="w") as c:
        keys = c.chunk_keys(list(range(512)))
        c.put(keys, [b"x" * 4096, b"y" * 4096])
        c.lookup(keys)
        result = subprocess.run(_watch(daemon, "--count", "3"), capture_output=True, text=True, timeout=60,
                                env=sandbox_env(daemon.workdir))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "hit rate (tokens)" in out and "100.0 %" in out
    assert "lookups/s" in out and "bytes in/s (put)" in out and "host" in out


def test_stats_watch_refreshes_in_place_on_a_terminal(daemon):
    main, sub = pty.openpty()
    env = sandbox_env(daemon.workdir, {"TERM": "xterm-256color", "COLUMNS": "100", "LINES": "40"})
    proc = subprocess.Popen(_watch(daemon, "--count", "3"), stdin=sub, stdout=sub, stderr=sub, env=env)
    os.close(sub)
    out = b""
    while True:
        ready, _, _ = select.select([main], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert proc.wait(30) == 0, out
    text = out.decode(errors="replace")
    assert text.count("hit rate") >= 2, text           # drawn more than once
    assert "\x1b[1A" in text or "\x1b[2K" in text       # ... by moving the cursor back over the old frame


class NotifyListener:
    """A service manager's notification socket: collects the datagrams the daemon sends."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.messages: list[dict[str, str]] = []

    def wait_for(self, key: str, timeout: float = 30) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            for msg in self.messages:
                if key in msg:
                    return msg
            left = deadline - time.monotonic()
            assert left > 0, f"no {key} notification; got {self.messages}"
            self.sock.settimeout(left)
            data = self.sock.recv(4096).decode()
            self.messages.append(dict(line.split("=", 1) for line in data.splitlines()))

    def close(self) -> None:
        self.sock.close()


def test_readiness_watchdog_and_stopping_notifications(start_daemon):
    from harness.daemons import short_tempdir

    workdir = short_tempdir()
    listener = NotifyListener(os.path.join(workdir, "notify"))
    try:
        env = {"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": "200000"}
        d = start_daemon(workdir=workdir, wait=False, env=env)
        ready = listener.wait_for("READY")
        assert ready["READY"] == "1" and ready["MAINPID"] == str(d.proc.pid)
        with d.client() as c:   # ready means the socket answers, at once
            c.ping()
        assert listener.wait_for("WATCHDOG")["WATCHDOG"] == "1"
        d.proc.send_signal(signal.SIGTERM)
        assert listener.wait_for("STOPPING")["STOPPING"] == "1"
        assert d.proc.wait(30) == 0
    finally:
        listener.close()
        shutil.rmtree(workdir, ignore_errors=True)


def test_put_in_flight_at_sigterm_completes_then_exit_zero(start_daemon):
    d = start_daemon("--shutdown-timeout", "20s")
    with d.client(namespace="s") as c:
        keys = c.chunk_keys(list(range(256)))
        header, _ = c.request({"op": Op.RESERVE, "keys": keys, "sizes": [100], "parent": None})
        d.proc.send_signal(signal.SIGTERM)
        wait_for_log(d, "event=stopping")
        assert not os.path.exists(d.socket_path)      # no new local client can connect
        with pytest.raises(kvstore.errors.UnavailableError, match="shutting down"):
            c.lookup(keys)                              # new work is refused ...
        c.ping()
        header, _ = c.request({"op": Op.COMMIT, "reservation": header["reservation"]})
        assert header["committed"] == 1                 # ... the put already started finishes
        assert d.proc.wait(30) == 0
    assert "unfinished_reservations=0" in d.log()


def test_abandoned_reservation_does_not_hold_the_stop_past_its_bound(start_daemon):
    d = start_daemon("--shutdown-timeout", "0.5s")
    with d.client(namespace="s") as c:
        c.request({"op": Op.RESERVE, "keys": c.chunk_keys(list(range(256))), "sizes": [100], "parent": None})
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(30) == 0
    assert "unfinished_reservations=1" in d.log()


def test_sigterm_under_load_exits_zero_and_cleans_up(start_daemon):
    d = start_daemon("--shutdown-timeout", "5s")
    with d.client() as c:
        arena = c.server_info["arena"]["path"]
    stop = threading.Event()
    unexpected: list[BaseException] = []
    done = [0] * 3

    def load(i: int) -> None:
        try:
            with d.client(namespace=f"load{i}", timeout=3.0) as c:
                n = 0
                while not stop.is_set():
                    keys = c.chunk_keys(list(range(n * 256, (n + 2) * 256)))
                    c.put(keys, [os.urandom(64 << 10), os.urandom(64 << 10)])
                    c.lookup(keys)
                    with c.get(keys) as views:
                        assert len(views) <= 2
                    n, done[i] = n + 1, done[i] + 1
        except (kvstore.errors.UnavailableError, kvstore.DaemonUnavailable):
            pass  # the daemon is going away: what a connector falls back on
        except BaseException as exc:  # noqa: BLE001 - collected, asserted on below
            unexpected.append(exc)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: min(done) >= 3 or bool(unexpected), 30)
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0, d.log()
    stop.set()
    for t in threads:
        t.join(30)
    assert not unexpected, unexpected
    assert not os.path.exists(d.socket_path) and not os.path.exists(arena)
    lines = [line for line in d.log().splitlines() if "event=" in line]
    assert all(re.match(r"ts=\S+ \S+ level=\w+ event=\w+( \w+=(\"[^\"]*\"|\S+))*$", line) for line in lines), lines
    assert any("event=drained" in line for line in lines)


def test_example_config_is_valid():
    config = build_config({"host_mem": "16MiB"}, os.path.join(REPO, "systemd", "kvstore.toml"))
    assert config.socket == "/run/kvstore/kvstore.sock" and config.metrics_host == "127.0.0.1"
    assert config.metrics_port > 0 and config.shutdown_timeout < 30  # below the unit's TimeoutStopSec


def test_systemd_unit_verifies(tmp_path):
    analyze = require("systemd-analyze")
    unit = open(os.path.join(REPO, "systemd", "kvstore.service")).read()
    for needed in ("Type=notify", "RuntimeDirectory=kvstore", "StateDirectory=kvstore", "LimitMEMLOCK=",
                   "WatchdogSec=", "ExecStart=/usr/local/bin/kvstore serve --config /etc/kvstore/kvstore.toml"):
        assert needed in unit
    for breaks_shm in ("\nPrivateDevices=yes", "\nRemoveIPC=yes", "\nPrivateIPC=yes", "\nDynamicUser=yes"):
        assert breaks_shm not in unit
    # verify checks that ExecStart exists: point it at this interpreter
    (tmp_path / "kvstore.service").write_text(unit.replace("/usr/local/bin/kvstore", f"{sys.executable} -m kvstore"))
    result = subprocess.run([analyze, "verify", str(tmp_path / "kvstore.service")], capture_output=True, text=True,
                            timeout=60)
    if result.returncode != 0 and "Failed to" in result.stderr and "kvstore.service" not in result.stderr:
        pytest.skip(f"systemd-analyze cannot run here: {result.stderr.strip()[:200]}")
    assert result.returncode == 0, result.stderr
    assert "kvstore.service" not in result.stderr, result.stderr  # no warning about our unit
