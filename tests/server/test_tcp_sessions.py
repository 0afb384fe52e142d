"""A ``tcp://`` client's session ends with its connection: when the client closes, its process dies, or it stops
answering heartbeats, the daemon drops the session and stops publishing for its engine (KV cache events); a
client that comes back says hello again and carries on. Real daemons, real client processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import wait_for
from harness.daemons import short_tempdir
from support.events_consumer import Consumer
from harness.workload import free_port

import kvstore
from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.protocol.engine_identity import EngineIdentity

CHUNK = 64 << 10
TOPIC = "kv@pod-t@llama"


def start(start_daemon, *extra: str):
    workdir = short_tempdir()
    pub = "ipc://" + os.path.join(workdir, "ev.sock")
    replay = "ipc://" + os.path.join(workdir, "evr.sock")
    tcp = f"127.0.0.1:{free_port()}"
    d = start_daemon("--tcp", tcp, "--events-endpoint", pub, "--events-replay-endpoint", replay, *extra,
                     workdir=workdir)
    return d, "tcp://" + tcp, pub, replay


def engine_put(client: kvstore.Client, seed: int) -> int:
    """Put one chunk named by the engine; returns its block hash."""
    client.put([os.urandom(16)], [os.urandom(CHUNK)], engine=[EngineBlocks(4, (seed,), None, (1, 2, 3, 4))])
    return seed


def stats(d) -> dict:
    with d.client(namespace="other") as c:
        return c.stats()


def seen(sub: Consumer, block: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sub.take_live(0.05)
        if block in sub.held:
            return True
    return False


def test_a_closed_tcp_session_ends_and_is_no_longer_published_for(start_daemon):
    d, tcp, pub, replay = start(start_daemon)
    sub = Consumer(pub, replay, topic=TOPIC, exact=True)
    raw = d.client(namespace="shared")
    try:
        engine = kvstore.connect(tcp, namespace="shared", identity=EngineIdentity("pod-t", "llama", 0), timeout=5)
        assert seen(sub, engine_put(engine, 11))   # its engine is published for while it is connected
        with_engine = stats(d)["sessions"]
        engine.close()
        assert wait_for(lambda: stats(d)["sessions"] == with_engine - 1, timeout=5)
        assert not seen(sub, engine_put(raw, 12), timeout=1.0)   # no longer its engine's
    finally:
        raw.close()
        sub.close()


CLIENT = textwrap.dedent("""
    import os, sys, time
    import kvstore
    from kvstore.protocol.engine_identity import EngineIdentity
    c = kvstore.connect(sys.argv[1], namespace="shared", identity=EngineIdentity("pod-t", "llama", 0), timeout=5)
    c.put([os.urandom(16)], [b"x" * 4096])
    print("ready", flush=True)
    for line in sys.stdin:   # each line: one more put, answered once done
        c.put([os.urandom(16)], [b"y" * 4096])
        print("put", flush=True)
""")


def client_process(tcp: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, tcp], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_killed_tcp_client_loses_its_session(start_daemon):
    d, tcp, _pub, _replay = start(start_daemon)
    alone = stats(d)["sessions"]
    proc = client_process(tcp)
    try:
        assert stats(d)["sessions"] == alone + 1
        proc.kill()
        proc.wait()
        assert wait_for(lambda: stats(d)["sessions"] == alone, timeout=5)
    finally:
        proc.kill()
        proc.wait()


def test_a_tcp_client_that_stops_answering_heartbeats_is_dropped_and_comes_back(start_daemon):
    d, tcp, _pub, _replay = start(start_daemon, "--tcp-heartbeat", "200ms")
    proc = client_process(tcp)
    try:
        sessions = stats(d)["sessions"]
        os.kill(proc.pid, signal.SIGSTOP)   # its connection stays open, its ZeroMQ thread answers nothing
        assert wait_for(lambda: stats(d)["sessions"] < sessions, timeout=10)
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("put\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "put"   # it said hello again and carried on
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("value", ["0", "-1s", "soon"])
def test_a_bad_heartbeat_is_refused_in_one_line(value):
    from kvstore.config import build_config
    from kvstore.errors import ConfigError
    with pytest.raises(ConfigError, match=r"tcp.heartbeat") as refused:
        build_config({"tcp_heartbeat": value})
    assert "\n" not in str(refused.value)
