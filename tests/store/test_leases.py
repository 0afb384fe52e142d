"""Leases expire; a killed client's leases and reservations are reclaimed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import wait_for

import kvstore




def test_lease_of_a_client_the_daemon_cannot_follow_expires(start_daemon):
    from support.raw_client import RawClient   # says hello without a pid, as a client in another pid namespace does
    from kvstore.protocol.wire import Op

    d = start_daemon("--lease-ttl", "0.5s", "--host-mem", "8MiB")
    raw = RawClient(d.address)
    try:
        with d.client(namespace="t") as c:
            keys = c.chunk_keys(list(range(256 * 4)))
            c.put(keys, [os.urandom(2 << 20)] * 4)
            assert raw.hello()["ok"]
            lease = raw.request({"op": Op.GET, "id": 2, "keys": keys})["lease"]
            assert c.stats()["leases"] == 1
            assert wait_for(lambda: c.stats()["leases"] == 0, 5)
            assert c.stats()["counters"]["expired_leases"] == 1 and c.stats()["leases_overdue"] == 0
            reply = raw.request({"op": Op.EXTEND, "id": 3, "lease": lease})
            assert not reply["ok"] and reply["code"] == kvstore.LeaseError.code
    finally:
        raw.close()


def test_lease_extend_keeps_it_alive(start_daemon):
    d = start_daemon("--lease-ttl", "1s")
    with d.client(namespace="t") as c:
        keys = c.chunk_keys(list(range(256)))
        c.put(keys, [b"x" * 100])
        lease = c.get(keys)
        for _ in range(4):   # the point: 1.6 s in all, past the 1 s TTL, alive only by being extended
            time.sleep(0.4)
            assert lease.extend() > 0.5
        assert c.stats()["leases"] == 1
        lease.release()
        assert c.stats()["leases"] == 0


CHILD = textwrap.dedent("""
    import os, sys, time, kvstore
    from kvstore.protocol.wire import Op
    c = kvstore.connect(sys.argv[1], namespace="t")
    keys = c.chunk_keys(list(range(256 * 2)))
    c.put(keys[:1], [b"a" * 4096])
    lease = c.get(keys[:1])
    c.request({"op": Op.RESERVE, "keys": keys[1:], "sizes": [1 << 20]})
    print("ready", flush=True)
    time.sleep(60)   # the point: a client that holds what it took until the test kills it
""")


@pytest.mark.parametrize("ttl_args, expect_within", [([], 3.0), (["--lease-ttl", "1s", "--reserve-ttl", "1s"], 3.0)])
def test_killed_client_releases_leases_and_reservations(start_daemon, ttl_args, expect_within):
    d = start_daemon(*ttl_args)
    child = subprocess.Popen([sys.executable, "-c", CHILD, d.address], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    with d.client(namespace="observer", use_arena=False) as c:
        s = c.stats()
        assert s["leases"] == 1 and s["reservations"] == 1
        child.send_signal(signal.SIGKILL)
        child.wait()
        # The daemon notices the process is gone (or the TTLs run out) and reclaims everything.
        assert wait_for(lambda: c.stats()["leases"] == 0 and c.stats()["reservations"] == 0, expect_within)
        assert c.stats()["tiers"]["host"]["used_bytes"] == 4096


def test_reservation_expires_without_commit(start_daemon):
    d = start_daemon("--reserve-ttl", "0.5s")
    with d.client(namespace="t") as c:
        from kvstore.protocol.wire import Op
        keys = c.chunk_keys(list(range(256)))
        header, _ = c.request({"op": Op.RESERVE, "keys": keys, "sizes": [1 << 20]})
        assert c.lookup(keys) == 0  # reserved chunks are invisible
        assert wait_for(lambda: c.stats()["reservations"] == 0, 5)
        with pytest.raises(kvstore.ReservationError):
            c.request({"op": Op.COMMIT, "reservation": header["reservation"]})
        assert c.stats()["tiers"]["host"]["used_bytes"] == 0


def test_leases_of_another_client_cannot_be_released(daemon):
    from kvstore.protocol.wire import Op
    with daemon.client(namespace="t") as a, daemon.client(namespace="t") as b:
        keys = a.chunk_keys(list(range(256)))
        a.put(keys, [b"p" * 100])
        lease = a.get(keys)
        with pytest.raises(kvstore.LeaseError, match="another client"):
            b.request({"op": Op.RELEASE, "lease": lease.id})
        with pytest.raises(kvstore.LeaseError):
            b.request({"op": Op.RELEASE, "lease": 12345})
        assert a.stats()["leases"] == 1
        lease.release()
        assert a.stats()["leases"] == 0
