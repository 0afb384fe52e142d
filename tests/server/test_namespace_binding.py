"""Keys are bound to their namespace in every tier: a client of one namespace that sends another namespace's keys
reaches only its own namespace's chunks (``kvstore/binding.py``). Real daemons: two clients, DRAM, the shared
index, the disk tier, warm restart, crash adoption and a cold restart that rebuilds from disk."""

from __future__ import annotations

import signal

import pytest

from conftest import wait_for

pytestmark = pytest.mark.integration

CHUNK = 4096
EVIL = b"EVILEVIL" * (CHUNK // 8)
GOOD = b"GOODGOOD" * (CHUNK // 8)
TOKENS = list(range(16 * 4))


def read(client, keys: list[bytes]) -> list[bytes]:
    with client.get(keys) as views:
        return [bytes(v) for v in views]


def settled(daemon) -> None:
    with daemon.client(namespace="probe") as c:
        wait_for(lambda: c.stats().get("adoption", {}).get("state", "done") == "done", timeout=30)


def test_another_namespace_put_under_my_keys_is_never_read_by_me(daemon):
    with daemon.client(namespace="nsA", chunk_tokens=16) as a, daemon.client(namespace="nsB", chunk_tokens=16) as b:
        keys = a.chunk_keys(TOKENS)
        assert b.put(keys, [EVIL] * len(keys)) == len(keys)   # nsB stores under nsA's keys first
        assert a.lookup(keys) == 0                               # the shared index answers
        assert a.lookup_tiers(keys, promote=False).count == 0
        assert a.put(keys, [GOOD] * len(keys)) == len(keys)     # stored, not skipped as "already held"
        assert a.lookup(keys) == len(keys)
        assert read(a, keys) == [GOOD] * len(keys)
        assert read(b, keys) == [EVIL] * len(keys)               # nsA's put changed nothing nsB reads


def test_a_put_under_another_namespaces_keys_changes_nothing_it_reads(daemon):
    with daemon.client(namespace="nsA", chunk_tokens=16) as a, daemon.client(namespace="nsB", chunk_tokens=16) as b:
        keys = a.chunk_keys(TOKENS)
        assert a.put(keys, [GOOD] * len(keys)) == len(keys)
        assert b.lookup(keys) == 0
        assert b.put(keys, [EVIL] * len(keys)) == len(keys)
        assert read(a, keys) == [GOOD] * len(keys)
        assert b.delete(keys) == len(keys)                        # nsB deletes its own copies, not nsA's
        assert read(a, keys) == [GOOD] * len(keys)


@pytest.mark.parametrize("how", ["sigterm", "sigkill", "cold"])
def test_the_binding_holds_across_restarts(start_daemon, how):
    flags = ("--adopt", "--host-mem", "64MiB") if how != "cold" else ("--host-mem", "64MiB")
    d = start_daemon(*flags)
    with d.client(namespace="nsA", chunk_tokens=16) as a, d.client(namespace="nsB", chunk_tokens=16) as b:
        keys = a.chunk_keys(TOKENS)
        assert b.put(keys, [EVIL] * len(keys)) == len(keys)
        assert a.put(keys, [GOOD] * len(keys)) == len(keys)
        if how == "cold":   # on disk before the stop
            assert wait_for(lambda: a.stats()["tiers"]["disk"]["chunks"] >= 2 * len(keys), timeout=30)
    d.stop(signal.SIGKILL if how == "sigkill" else signal.SIGTERM)
    d.start()
    settled(d)
    with d.client(namespace="nsA", chunk_tokens=16) as a, d.client(namespace="nsB", chunk_tokens=16) as b:
        assert a.lookup(keys) == len(keys)
        assert read(a, keys) == [GOOD] * len(keys)
        assert read(b, keys) == [EVIL] * len(keys)
        with d.client(namespace="nsC", chunk_tokens=16) as c:
            assert c.lookup(keys) == 0
