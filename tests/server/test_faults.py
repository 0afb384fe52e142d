"""Fault injection: the daemon killed mid-write, engines killed holding pins, clients across a daemon restart.

The promise checked here: whatever is injected, every chunk a reader is handed carries exactly the bytes that
were put under its key (payloads are derived from keys, see ``workload.py``), and the daemon keeps serving.
With a persistent tier (``--disk-dir``, when the daemon has one) the same test also counts the chunks that
survive each crash; host-only daemons start empty after a crash, so there is nothing to recover.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import wait_for

import kvstore
from kvstore.protocol.wire import Op

from harness.crashes import acked_keys, read_back
from harness.workload import parse_counts, payload_for, total, worker_command




def daemon_disk(address: str, what: str) -> int:
    """The disk tier of the daemon on `address`: its ``chunks`` now, or its ``disk_writes`` since it started."""
    with kvstore.connect(address, namespace="faults-probe", timeout=10) as c:
        stats = c.stats()
    return int(stats["tiers"]["disk"]["chunks"] if what == "chunks" else stats["counters"][what])


def persistence_args(workdir: str) -> list[str]:
    """Flags that give the daemon a persistent tier, or [] while it has none (then nothing survives a crash)."""
    from kvstore.config import SETTINGS
    if not any(s.name == "disk_dir" for s in SETTINGS):
        return []
    return ["--disk-dir", os.path.join(workdir, "disk")]


def test_kill9_during_heavy_puts_never_serves_wrong_bytes(start_daemon, tmp_path):
    rng = random.Random(1234)
    d = start_daemon("--host-mem", "24MiB")  # small: writers also force evictions all along
    persist = persistence_args(d.workdir)
    if persist:
        d.stop()
        d.args += persist
        d.start()
    # The workers run until the crash loop below is done (the stop file), not for a fixed time: on a loaded
    # machine the loop's waits for acknowledged puts can outlast any fixed run. 240 s is only the cap.
    stop = tmp_path / "stop"
    workers, acked = [], []
    for i in range(3):
        acked.append(str(tmp_path / f"acked{i}"))
        cmd = worker_command(d.address, 240, seed=i, tolerate_outage=True, acked_path=acked[-1], timeout=1,
                             max_chunks=12, stop_path=str(stop))
        workers.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    crashes = []
    for _ in range(4):
        time.sleep(rng.uniform(0.8, 2.0))   # the point: each crash at a random moment of the workers' stream
        # On a loaded machine the workers may not have been acknowledged yet: a crash with nothing at stake
        # tests nothing, so each kill waits for new acknowledged chunks first.
        seen = len(acked_keys(acked))
        assert wait_for(lambda: len(acked_keys(acked)) > seen, timeout=60), "no put was acknowledged"  # noqa: B023
        if persist:
            # A crash before the disk writer's first chunk since the start loses everything put since: nothing
            # at stake for the disk. Once one is written, the restarted daemon must find it.
            assert wait_for(lambda: daemon_disk(d.address, "disk_writes") > 0, timeout=60), "nothing written to disk"
        before = acked_keys(acked)
        d.stop(signal.SIGKILL)
        d.start()
        # read back: the newest acknowledged chunks (of the last worker's file, which `acked_keys` lists last)
        correct, corrupt, missing = read_back(d.address, before[-300:])
        on_disk = daemon_disk(d.address, "chunks") if persist else 0
        crashes.append({"acked": len(before), "recovered": correct, "corrupt": corrupt, "lost": missing,
                        "on_disk": on_disk})
        assert corrupt == 0, crashes
        if persist:
            assert on_disk > 0, f"a persistent daemon recovered nothing: {crashes}"
    # The workers carry on after the last restart: new puts are acknowledged before they are told to stop.
    seen = len(acked_keys(acked))
    assert wait_for(lambda: len(acked_keys(acked)) > seen, timeout=60), "no put was acknowledged after the last restart"
    stop.touch()
    results = []
    for w in workers:
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
        results.append(parse_counts(out))
    counts = total(results)
    assert counts.corrupt == 0 and counts.errors == 0, (counts, [w for w in results])
    assert counts.chunks_read > 0 and counts.chunks_written > 0
    # Everything still stored at the end reads back exactly.
    correct, corrupt, _ = read_back(d.address, acked_keys(acked)[-500:])
    assert corrupt == 0 and correct > 0
    print("crashes:", crashes, "workers:", counts)


ENGINE = textwrap.dedent("""
    import sys, time, kvstore
    from kvstore.protocol.wire import PROTOCOL_VERSION, Op
    c = kvstore.connect(sys.argv[1], namespace="t")
    # Say hello again without a pid: the daemon cannot watch this process and must rely on the TTLs.
    c.transport.call({"op": Op.HELLO, "version": PROTOCOL_VERSION, "namespace": "t", "arena": True, "pid": 0})
    keys = c.chunk_keys(list(range(256 * 3)))
    c.put(keys[:1], [b"a" * 4096])
    lease = c.get(keys[:1])
    c.request({"op": Op.RESERVE, "keys": keys[1:], "sizes": [1 << 20, 1 << 20]})
    print("ready", flush=True)
    time.sleep(60)   # the point: an engine that holds what it took until the test kills it
""")


def test_killed_engine_memory_returns_within_ttl(start_daemon):
    d = start_daemon("--lease-ttl", "1s", "--reserve-ttl", "1s")
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, d.address], stdout=subprocess.PIPE, text=True)
    try:
        assert engine.stdout.readline().strip() == "ready"
        with d.client(namespace="observer", use_arena=False) as c:
            s = c.stats()
            assert s["leases"] == 1 and s["reservations"] == 1
            assert s["tiers"]["host"]["used_bytes"] >= 2 << 20
            engine.send_signal(signal.SIGKILL)
            engine.wait()
            assert wait_for(lambda: c.stats()["leases"] == 0 and c.stats()["reservations"] == 0, 5)
            assert c.stats()["tiers"]["host"]["used_bytes"] == 4096  # only the committed chunk is left
    finally:
        engine.kill()
        engine.wait()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_daemon_killed_while_clients_connected(start_daemon, transport):
    from harness.workload import free_port
    port = free_port()
    d = start_daemon("--tcp", f"127.0.0.1:{port}")
    address = d.address if transport == "ipc" else f"tcp://127.0.0.1:{port}"
    c = kvstore.connect(address, namespace="t", timeout=1.0)
    keys = c.chunk_keys(list(range(256 * 3)))
    payloads = [payload_for(k) for k in keys]
    c.put(keys, payloads)
    held = c.get(keys)  # a lease held across the crash
    d.stop(signal.SIGKILL)

    for call in (lambda: c.lookup(keys), lambda: c.put(keys, payloads), lambda: c.get(keys), c.ping):
        with pytest.raises(kvstore.DaemonUnavailable):   # by the client's timeout at the latest, never a hang
            call()

    d.start()
    held.release()  # the lease died with the daemon: releasing it is harmless
    assert 0 <= c.lookup(keys) <= 3  # the same client says hello again; completed disk writes survive
    c.put(keys, payloads)
    with c.get(keys) as views:
        assert [bytes(v) for v in views] == payloads
    # A fresh client sees the same bytes: the old one re-mapped the new daemon's arena, not the dead one's.
    with d.client(namespace="t") as fresh, fresh.get(keys) as views:
        assert [bytes(v) for v in views] == payloads
    c.close()


def test_requests_in_flight_across_restart_never_commit_wrong_bytes(start_daemon):
    """A put whose reservation was taken from the old daemon cannot commit into the new one."""
    d = start_daemon()
    with d.client(namespace="t") as c:
        keys = c.chunk_keys(list(range(256)))
        header, _ = c.request({"op": Op.RESERVE, "keys": keys, "sizes": [4096]})
        d.stop(signal.SIGKILL)
        d.start()
        with pytest.raises((kvstore.VersionError, kvstore.ReservationError)):
            c.request({"op": Op.COMMIT, "reservation": header["reservation"]}, retry=False)
        c.ping()  # says hello again
        with pytest.raises(kvstore.ReservationError):
            c.request({"op": Op.COMMIT, "reservation": header["reservation"]})
        assert c.lookup(keys) == 0
