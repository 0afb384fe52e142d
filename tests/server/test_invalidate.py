"""``kvstore invalidate`` with real daemons: an operator drops named namespaces' chunks (or every namespace of a
model, by prefix) from DRAM and disk, with KV cache events for what went; other namespaces keep theirs, leased
views stay readable, a restart brings nothing back, and another user's client is refused."""

from __future__ import annotations

import json
import os
import signal

import pytest

import kvstore
from conftest import wait_for
from kvstore.protocol.kv_events import block_hash
from harness.daemons import run_cli, short_tempdir
from support.users import as_other_user

pytestmark = pytest.mark.integration

CHUNK = 4096
MODEL = "vllm:org/model-a"
NAMESPACES = (MODEL, MODEL + ";salt=s1", "vllm:org/model-b")


def fill(d) -> dict[str, list[bytes]]:
    """Four chunks in each of ``NAMESPACES``, written to disk too."""
    keys = {}
    for ns in NAMESPACES:
        with d.client(namespace=ns, chunk_tokens=16) as c:
            keys[ns] = c.chunk_keys(list(range(64)))
            assert c.put(keys[ns], [ns.encode().ljust(CHUNK, b".")] * 4) == 4
    with d.client(namespace="probe") as c:
        assert wait_for(lambda: c.stats()["tiers"]["disk"]["chunks"] >= 12, timeout=30)
    return keys


def held(d, ns: str, keys: list[bytes]) -> int:
    with d.client(namespace=ns, chunk_tokens=16) as c:
        return c.lookup(keys)


def invalidate_cli(d, *args: str) -> dict:
    out = run_cli("invalidate", "--socket", d.socket_path, "--json", *args, check=True)
    return json.loads(out.stdout)


def test_a_model_prefix_drops_its_namespaces_from_every_tier_and_a_restart_brings_nothing_back(start_daemon):
    d = start_daemon("--no-adopt", "--host-mem", "64MiB")
    keys = fill(d)
    with d.client(namespace=MODEL, chunk_tokens=16) as reader:
        lease = reader.get(keys[MODEL][:2])   # a reader still holds two of them
        report = invalidate_cli(d, "--prefix", MODEL)
        assert report["chunks"] == {MODEL: 4, MODEL + ";salt=s1": 4}
        assert reader.lookup(keys[MODEL]) == 0                       # invisible at once, leased or not
        assert [bytes(v[:len(MODEL)]) for v in lease.views] == [MODEL.encode()] * 2   # the lent bytes stay
        lease.release()
    assert held(d, MODEL + ";salt=s1", keys[MODEL + ";salt=s1"]) == 0
    assert held(d, "vllm:org/model-b", keys["vllm:org/model-b"]) == 4
    with d.client(namespace="probe") as c:
        assert wait_for(lambda: c.stats()["tiers"]["disk"]["chunks"] == 4, timeout=30)
    d.stop()
    d.start()   # a cold restart: the disk index is rebuilt from the files left
    assert held(d, MODEL, keys[MODEL]) == 0
    assert held(d, "vllm:org/model-b", keys["vllm:org/model-b"]) == 4


def test_a_namespace_named_exactly_drops_only_itself_and_a_kept_arena_adopts_none_of_it(start_daemon):
    d = start_daemon("--adopt", "--disk-size", "0", "--host-mem", "64MiB")
    keys = {}
    for ns in NAMESPACES:
        with d.client(namespace=ns, chunk_tokens=16) as c:
            keys[ns] = c.chunk_keys(list(range(64)))
            assert c.put(keys[ns], [b"x" * CHUNK] * 4) == 4
    with d.client(namespace="operator") as c:
        report = c.invalidate([MODEL, "never-held"])
    assert report["chunks"] == {MODEL: 4, "never-held": 0}
    assert held(d, MODEL + ";salt=s1", keys[MODEL + ";salt=s1"]) == 4
    d.stop(signal.SIGTERM)
    d.start()
    with d.client(namespace="probe") as c:
        assert wait_for(lambda: c.stats()["adoption"]["state"] != "verifying", timeout=30)
    assert held(d, MODEL, keys[MODEL]) == 0
    assert held(d, MODEL + ";salt=s1", keys[MODEL + ";salt=s1"]) == 4


def test_the_events_name_what_was_dropped(start_daemon):
    from support.events_consumer import Consumer

    workdir = short_tempdir()
    pub, replay = ("ipc://" + os.path.join(workdir, name) for name in ("ev.sock", "evr.sock"))
    d = start_daemon("--events-endpoint", pub, "--events-replay-endpoint", replay, "--events-topic", "kv@test",
                     "--disk-size", "0", workdir=workdir)
    consumer = Consumer(pub, replay, topic="kv@")
    try:
        with d.client(namespace=MODEL, chunk_tokens=16) as a, d.client(namespace="other", chunk_tokens=16) as b:
            gone, kept = a.chunk_keys(list(range(64))), b.chunk_keys(list(range(100, 164)))
            a.put(gone, [b"a" * CHUNK] * 4)
            b.put(kept, [b"b" * CHUNK] * 4)
            a.invalidate([MODEL])
            assert wait_for(lambda: a.stats()["events"]["pending"] == 0, timeout=30)
            stats = a.stats()
            consumer.pump(stats["events"]["next_seq"] - 1, stats["events"]["incarnation"])
        assert not any(block_hash(k) in consumer.held for k in gone)
        assert all(consumer.held.get(block_hash(k)) == {"CPU"} for k in kept)
        assert "BlockRemoved" in consumer.kinds
    finally:
        consumer.close()


def test_bad_requests_are_refused_in_one_line(daemon):
    out = run_cli("invalidate", "--socket", daemon.socket_path, "--prefix", "")
    assert out.returncode == 1 and "empty prefix" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    with daemon.client(namespace="x") as c:
        with pytest.raises(kvstore.UsageError):
            c.invalidate([])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user (setuid in a child)")
def test_another_users_client_is_refused(start_daemon):
    workdir = short_tempdir()
    os.chmod(workdir, 0o755)
    d = start_daemon("--host-mem", "16MiB", "--disk-size", "0", workdir=workdir)
    stream = d.socket_path + ".stream"
    for path in (d.socket_path, stream):
        if os.path.exists(path):
            os.chmod(path, 0o666)   # the operator lets the other user reach the sockets
    with d.client(namespace=MODEL, chunk_tokens=16) as c:
        keys = c.chunk_keys(list(range(64)))
        c.put(keys, [b"x" * CHUNK] * 4)

    def probe() -> list[str]:
        try:
            with kvstore.connect(d.address, namespace="nobody", timeout=10, use_arena=False) as c:
                c.invalidate([MODEL])
                return ["accepted"]
        except kvstore.KVStoreError as exc:
            return [type(exc).__name__]

    assert as_other_user(65533, 65533, probe) == ["PermissionDeniedError"]
    assert held(d, MODEL, keys) == 4
