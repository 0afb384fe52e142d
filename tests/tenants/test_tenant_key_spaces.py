"""Real daemons keep a restricted tenant's chunks in its own key space (``kvstore/tenants/key_space.py``): a put of
its raw keys neither reveals nor touches them, a shared remote store gives them only to the tenant, a restart
keeps them, and a key file the daemon cannot trust refuses the start in one line."""

from __future__ import annotations

import os
import stat

import pytest

from conftest import wait_for

import kvstore
from harness.daemons import run_cli

from harness.servers import RedisServer, require

pytestmark = pytest.mark.integration

TABLE = f"""
[tenants.team]
namespaces = ["team:"]
uids = [{os.getuid()}]
"""
OPEN_TABLE = '[tenants.team]\nnamespaces = ["team:"]\n'
CHUNKS = 3


def _config(tmp_path, table: str = TABLE) -> str:
    path = tmp_path / "kvstore.toml"
    path.write_text(table)
    return str(path)


def _chain() -> tuple[list[bytes], list[bytes]]:
    return [os.urandom(16) for _ in range(CHUNKS)], [os.urandom(8192 + 512 * i) for i in range(CHUNKS)]


def _read(client: kvstore.Client, keys: list[bytes]) -> list[bytes]:
    with client.get(keys) as views:
        return [bytes(v) for v in views]


@pytest.mark.parametrize("use_arena", [True, False], ids=["reserve", "put_inline"])
def test_a_put_of_another_tenants_raw_keys_gets_slots_and_reveals_nothing(start_daemon, tmp_path, use_arena):
    daemon = start_daemon("--config", _config(tmp_path), "--host-mem", "16MiB", "--disk-size", "0")
    keys, theirs = _chain()
    mine = [os.urandom(len(p)) for p in theirs]
    with daemon.client(namespace="team:a") as team:
        assert team.put(keys, theirs) == CHUNKS
    with daemon.client(namespace="open", use_arena=use_arena) as prober:
        assert prober.lookup(keys) == 0
        assert prober.put(keys, mine) == CHUNKS              # slots lent and committed, not "already stored"
        assert prober.lookup(keys) == CHUNKS and _read(prober, keys) == mine
        assert prober.delete(keys) == CHUNKS                 # its own chunks: the tenant's are not named
    with daemon.client(namespace="team:a") as team:
        assert team.lookup(keys) == CHUNKS and _read(team, keys) == theirs


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path / "redis", binary=require("redis-server")).start()
    yield server
    server.stop()


def test_a_shared_remote_store_gives_a_tenants_chunks_to_the_tenant_only(start_daemon, redis_server, tmp_path):
    """Host A's tenant puts; host B holds nothing of it, so every lookup there goes to the remote store."""
    config = _config(tmp_path)
    secret = str(tmp_path / "shared.secret")    # one file for both daemons: one key space for the tenant
    flags = ("--config", config, "--remote", redis_server.url, "--remote-wait", "5s", "--disk-size", "0",
             "--tenant-key-file", secret)
    a, b = start_daemon(*flags), start_daemon(*flags)
    keys, payloads = _chain()
    with a.client(namespace="team:a") as team:
        assert team.put(keys, payloads) == CHUNKS
        assert wait_for(lambda: team.stats()["remote"]["puts"] >= CHUNKS, timeout=30), team.stats()["remote"]
    with b.client(namespace="open", use_arena=False) as prober:
        found = prober.lookup_tiers(keys)
        assert found.count == 0 and found.tiers == {}                      # asked, and nothing under raw keys
        assert prober.stats()["remote"]["lookups"] == 1
        assert _read(prober, keys) == []
    with b.client(namespace="team:a") as team:
        found = team.lookup_tiers(keys)
        assert found.count == CHUNKS and found.tiers == {"remote": CHUNKS}
        assert _read(team, keys) == payloads
    elsewhere = start_daemon(*flags[:-1], str(tmp_path / "another.secret"))
    with elsewhere.client(namespace="team:a") as team:
        assert team.lookup(keys) == 0     # another secret is another key space: copy the file to share chunks


def test_a_restart_keeps_the_tenants_chunks_on_disk_reachable(start_daemon, tmp_path):
    daemon = start_daemon("--config", _config(tmp_path), "--host-mem", "16MiB")
    secret = os.path.join(daemon.workdir, "disk", "tenant-keys.secret")   # the default: in --disk-dir
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600 and os.path.getsize(secret) == 32
    keys, payloads = _chain()
    with daemon.client(namespace="team:a") as team:
        assert team.put(keys, payloads) == CHUNKS
    daemon.restart()                       # --no-adopt: DRAM starts empty; the disk index is rebuilt
    with daemon.client(namespace="team:a") as team:
        found = team.lookup_tiers(keys)
        assert found.count == CHUNKS and found.tiers == {"disk": CHUNKS}
        assert _read(team, keys) == payloads
    with daemon.client(namespace="open") as prober:
        assert prober.lookup(keys) == 0


def test_a_host_without_restricted_tenants_makes_no_key_file(start_daemon, tmp_path):
    daemon = start_daemon("--config", _config(tmp_path, OPEN_TABLE), "--host-mem", "16MiB")
    secret = os.path.join(daemon.workdir, "disk", "tenant-keys.secret")
    assert not os.path.exists(secret)
    (tmp_path / "kvstore.toml").write_text(TABLE)      # the first restricted tenant comes with a reload
    done = run_cli("reload", "--socket", daemon.socket_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert os.path.getsize(secret) == 32


def _spoil_size(path: str) -> None:
    with open(path, "wb") as f:
        f.write(b"short")
    os.chmod(path, 0o600)


def _spoil_mode(path: str) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(32))
    os.chmod(path, 0o644)


@pytest.mark.parametrize("spoil, message", [
    (_spoil_size, "holds 5 bytes, not 32: it is not a tenant key file"),
    (_spoil_mode, "is open to group or others (mode 0644); it holds the tenants' key secret: chmod 600"),
])
def test_a_bad_key_file_refuses_the_start_in_one_line(start_daemon, tmp_path, spoil, message):
    secret = str(tmp_path / "bad.secret")
    spoil(secret)
    d = start_daemon("--config", _config(tmp_path), "--host-mem", "16MiB", "--disk-size", "0",
                     "--tenant-key-file", secret, wait=False)
    assert d.proc.wait(30) == 2
    errors = [line for line in d.log().splitlines() if not line.startswith("ts=")]
    assert errors == [f"kvstore: error: --tenant-key-file: {secret} {message}" + errors[0].split(message, 1)[1]]
    assert not os.path.exists(d.socket_path)


def test_a_reload_that_needs_a_bad_key_file_is_refused_and_the_table_stays(start_daemon, tmp_path):
    secret = str(tmp_path / "bad.secret")
    _spoil_size(secret)
    daemon = start_daemon("--config", _config(tmp_path, OPEN_TABLE), "--host-mem", "16MiB", "--disk-size", "0",
                          "--tenant-key-file", secret)
    (tmp_path / "kvstore.toml").write_text(TABLE)
    done = run_cli("reload", "--socket", daemon.socket_path, timeout=60)
    assert done.returncode == 1 and "--tenant-key-file: " in done.stdout + done.stderr
    with daemon.client(namespace="team:a", use_arena=False) as anyone:   # the old table: team: is still open
        keys, payloads = _chain()
        assert anyone.put(keys, payloads) == CHUNKS


def test_a_session_follows_its_namespace_into_a_new_space_at_a_reload(start_daemon, tmp_path):
    config = _config(tmp_path, OPEN_TABLE)
    daemon = start_daemon("--config", config, "--host-mem", "16MiB", "--disk-size", "0")
    keys, raw = _chain()
    scoped = [os.urandom(len(p)) for p in raw]
    with daemon.client(namespace="team:a", shared_index=False) as team:
        assert team.put(keys, raw) == CHUNKS                 # open: stored under the raw keys
        (tmp_path / "kvstore.toml").write_text(TABLE)
        assert run_cli("reload", "--socket", daemon.socket_path, timeout=60).returncode == 0
        assert team.lookup(keys) == 0                        # its next request is mapped: the old chunks miss
        assert team.put(keys, scoped) == CHUNKS              # and a put of the same keys stores new ones
        assert _read(team, keys) == scoped
        (tmp_path / "kvstore.toml").write_text(OPEN_TABLE)
        assert run_cli("reload", "--socket", daemon.socket_path, timeout=60).returncode == 0
        assert _read(team, keys) == raw                      # open again: the raw keys' chunks, still held
