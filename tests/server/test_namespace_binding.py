"""Keys are bound to their namespace in every tier: a client of one namespace that sends another namespace's keys
reaches only its own namespace's chunks (``kvstore/binding.py``). Real daemons: two clients, DRAM, the shared
index, the disk tier, warm restart, crash adoption and a cold restart that rebuilds from disk."""

from __future__ import annotations

import os
import signal

import pytest

from conftest import wait_for
from kvstore.binding import rebind
from kvstore.tiers.disk.format import unpack_header

pytestmark = pytest.mark.integration

CHUNK = 4096
EVIL = b"EVILEVIL" * (CHUNK // 8)
GOOD = b"GOODGOOD" * (CHUNK // 8)
TOKENS = list(range(16 * 4))


def disk_dir(d) -> str:
    return os.path.join(d.workdir, "disk")


def read(client, keys: list[bytes]) -> list[bytes]:
    with client.get(keys) as views:
        return [bytes(v) for v in views]


def settled(daemon) -> None:
    with daemon.client(namespace="probe") as c:
        assert wait_for(lambda: c.stats()["adoption"]["state"] != "verifying", timeout=30)


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


RESTARTS = {   # how the daemon stops, and what it is started with: the DRAM tier only, or the disk tier only
    "sigterm": ("--adopt", "--disk-size", "0", "--host-mem", "64MiB"),
    "sigkill": ("--adopt", "--disk-size", "0", "--host-mem", "64MiB"),
    "cold": ("--no-adopt", "--host-mem", "64MiB"),
}


def written_down(client, how: str, chunks: int) -> bool:
    """Whether what the restart brings back is written: the journal's records (their checksums taken), or the
    disk copies."""
    stats = client.stats()
    if how == "cold":
        return bool(stats["tiers"]["disk"]["chunks"] >= chunks)
    return bool(stats["integrity"]["sums_pending"] == 0)


@pytest.mark.parametrize("how", sorted(RESTARTS))
def test_the_binding_holds_across_restarts(start_daemon, how):
    d = start_daemon(*RESTARTS[how])
    with d.client(namespace="nsA", chunk_tokens=16) as a, d.client(namespace="nsB", chunk_tokens=16) as b:
        keys = a.chunk_keys(TOKENS)
        assert b.put(keys, [EVIL] * len(keys)) == len(keys)
        assert a.put(keys, [GOOD] * len(keys)) == len(keys)
        assert wait_for(lambda: written_down(a, how, 2 * len(keys)), timeout=30)
    d.stop(signal.SIGKILL if how == "sigkill" else signal.SIGTERM)
    d.start()
    settled(d)
    with d.client(namespace="nsA", chunk_tokens=16) as a, d.client(namespace="nsB", chunk_tokens=16) as b:
        assert a.lookup(keys) == len(keys)
        assert read(a, keys) == [GOOD] * len(keys)
        assert read(b, keys) == [EVIL] * len(keys)
        with d.client(namespace="nsC", chunk_tokens=16) as c:
            assert c.lookup(keys) == 0


def test_disk_files_from_before_the_binding_are_renamed_and_served(start_daemon):
    """A file a daemon from before the binding wrote holds the key as sent and is named by it: the next start
    renames it to its bound key and serves it to its namespace only."""
    d = start_daemon("--no-adopt", "--host-mem", "64MiB")
    with d.client(namespace="nsA", chunk_tokens=16) as a:
        keys = a.chunk_keys(TOKENS)
        assert a.put(keys, [GOOD] * len(keys)) == len(keys)
        assert wait_for(lambda: a.stats()["tiers"]["disk"]["chunks"] >= len(keys), timeout=30)
    d.stop()
    disk = disk_dir(d)
    files = [os.path.join(root, f) for root, _, names in os.walk(disk) for f in names if f.endswith(".kv")]
    assert len(files) == len(keys)
    for path in files:   # each as the older daemon named it: by the key its client sent
        with open(path, "rb") as f:
            header = unpack_header(f.read(4096))
        assert rebind("nsA", header.key) in keys   # the header holds the key as sent
        sent = rebind("nsA", header.key).hex()
        old = os.path.join(disk, sent[:2], sent + ".kv")
        os.makedirs(os.path.dirname(old), exist_ok=True)
        os.rename(path, old)
    d.start()
    assert "renamed=4" in d.log()
    with d.client(namespace="nsA", chunk_tokens=16) as a, d.client(namespace="nsB", chunk_tokens=16) as b:
        assert read(a, keys) == [GOOD] * len(keys)
        assert b.lookup(keys) == 0
