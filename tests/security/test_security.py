"""Who may connect: owner-only files, CURVE on tcp://, and clients that cannot touch each other's pins."""

from __future__ import annotations

import errno
import os
import pwd
import socket
import stat
import subprocess

import pytest

import kvstore
from kvstore.protocol.wire import Op
from kvstore.security import ClientCurve, generate_keypair, is_loopback
from kvstore.mapped.arena import arena_path_for

from harness.daemons import run_cli, short_tempdir
from support.users import as_other_user
from harness.workload import free_port, payload_for


def kvstore_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=timeout)


def mode_of(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- key files ----------------------------------------------------------------------------------------------

def test_keygen_writes_owner_only_files(tmp_path):
    directory = str(tmp_path / "curve")
    result = kvstore_cli("keygen", "--dir", directory, "--name", "engine-1")
    assert result.returncode == 0, result.stderr
    assert mode_of(directory) == 0o700
    for name in ("engine-1.key", "engine-1.key_secret"):
        assert mode_of(os.path.join(directory, name)) == 0o600
    secret = ClientCurve.load(os.path.join(directory, "engine-1.key"), os.path.join(directory, "engine-1.key_secret"))
    assert len(secret.pair.public) == 40 and len(secret.pair.secret) == 40
    again = kvstore_cli("keygen", "--dir", directory, "--name", "engine-1")
    assert again.returncode == 2 and "--force" in again.stderr
    assert kvstore_cli("keygen", "--dir", directory, "--name", "engine-1", "--force").returncode == 0


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.9.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("*", False), ("10.0.0.5", False), ("::", False), ("eth0", False), ("example.com", False),
])
def test_loopback_detection(host, loopback):
    assert is_loopback(host) is loopback


@pytest.fixture
def keys(tmp_path):
    """A daemon key pair, an allowed client, and a client the daemon does not know."""
    base = str(tmp_path)
    generate_keypair(os.path.join(base, "server"), "server")
    generate_keypair(os.path.join(base, "clients"), "engine")
    generate_keypair(os.path.join(base, "strangers"), "rogue")
    return {
        "server_secret": os.path.join(base, "server", "server.key_secret"),
        "server_public": os.path.join(base, "server", "server.key"),
        "clients": os.path.join(base, "clients"),
        "engine": os.path.join(base, "clients", "engine.key_secret"),
        "rogue": os.path.join(base, "strangers", "rogue.key_secret"),
        "rogue_public": os.path.join(base, "strangers", "rogue.key"),
    }


@pytest.mark.parametrize("extra, needle", [
    ([], "needs CURVE authentication"),
    (["--curve-client-keys", "CLIENTS"], "--curve-client-keys needs --curve-server-key"),
    (["--curve-server-key", "SECRET"], "--curve-server-key needs --curve-client-keys"),
])
def test_non_loopback_tcp_refused_without_curve(keys, extra, needle):
    extra = [{"CLIENTS": keys["clients"], "SECRET": keys["server_secret"]}.get(a, a) for a in extra]
    sock = os.path.join(short_tempdir(), "kv.sock")
    result = kvstore_cli("serve", "--socket", sock, "--host-mem", "8MiB", "--tcp", f"0.0.0.0:{free_port()}", *extra)
    assert result.returncode == 2
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_readable_secret_key_refused(keys):
    os.chmod(keys["server_secret"], 0o644)
    sock = os.path.join(short_tempdir(), "kv.sock")
    result = kvstore_cli("serve", "--socket", sock, "--host-mem", "8MiB", "--disk-size", "0",
                         "--tcp", f"127.0.0.1:{free_port()}", "--curve-server-key", keys["server_secret"],
                         "--curve-client-keys", keys["clients"])
    assert result.returncode == 2 and "chmod 600" in result.stderr


# -- CURVE on tcp:// ----------------------------------------------------------------------------------------

def test_curve_admits_known_keys_only(start_daemon, keys):
    port = free_port()
    d = start_daemon("--tcp", f"0.0.0.0:{port}", "--curve-server-key", keys["server_secret"],
                     "--curve-client-keys", keys["clients"])
    address = f"tcp://127.0.0.1:{port}"
    good = ClientCurve.load(keys["server_public"], keys["engine"])
    with kvstore.connect(address, namespace="t", curve=good, timeout=5) as c:
        chunk_keys = c.chunk_keys(list(range(512)))
        c.put(chunk_keys, [payload_for(k, 3000) for k in chunk_keys])
        with c.get(chunk_keys) as views:
            assert [bytes(v) for v in views] == [payload_for(k, 3000) for k in chunk_keys]

    def rejected() -> int:
        with kvstore.connect(address, namespace="t", curve=good, timeout=5) as c:
            return c.stats()["auth_rejected"]

    # As docs/deployment/security.md says: each refusal names its cause; only an unknown key reaches the ZAP
    # handler and counts.
    rogue = ClientCurve.load(keys["server_public"], keys["rogue"])
    with pytest.raises(kvstore.DaemonUnavailable, match="refused this client's CURVE key"):
        kvstore.connect(address, namespace="t", curve=rogue, timeout=1)
    counted = rejected()
    assert counted >= 1
    with pytest.raises(kvstore.DaemonUnavailable, match="requires CURVE authentication; set KVSTORE_CURVE"):
        kvstore.connect(address, namespace="t", timeout=1)  # no CURVE at all
    wrong_server = ClientCurve(server_public=rogue.pair.public, pair=good.pair)
    with pytest.raises(kvstore.DaemonUnavailable, match="server key this client holds is not that daemon's"):
        kvstore.connect(address, namespace="t", curve=wrong_server, timeout=1)  # talks to the wrong daemon
    assert rejected() == counted   # refused by the handshake itself, before ZAP: not counted

    # Adding the key to the allow-list admits the client without a restart.
    with open(keys["rogue_public"]) as src, open(os.path.join(keys["clients"], "rogue.key"), "w") as dst:
        dst.write(src.read())
    with kvstore.connect(address, namespace="t", curve=rogue, timeout=5) as c:
        assert c.lookup(chunk_keys) == 2
        assert c.stats()["auth_rejected"] >= 1
    # The local socket stays as it was: file permissions decide who reaches it.
    with d.client(namespace="t") as local:
        assert local.lookup(chunk_keys) == 2


def test_curve_keys_from_environment(start_daemon, keys, monkeypatch):
    port = free_port()
    start_daemon("--tcp", f"127.0.0.1:{port}", "--curve-server-key", keys["server_secret"],
                 "--curve-client-keys", keys["clients"])
    monkeypatch.setenv("KVSTORE_CURVE_SERVER_KEY", keys["server_public"])
    monkeypatch.setenv("KVSTORE_CURVE_CLIENT_KEY", keys["engine"])
    result = kvstore_cli("stats", "--address", f"tcp://127.0.0.1:{port}", "--json")
    assert result.returncode == 0, result.stderr
    monkeypatch.setenv("KVSTORE_CURVE_CLIENT_KEY", keys["rogue"])
    refused = kvstore_cli("stats", "--address", f"tcp://127.0.0.1:{port}", "--timeout", "1")
    assert refused.returncode == 1 and "refused this client's CURVE key" in refused.stderr
    monkeypatch.delenv("KVSTORE_CURVE_SERVER_KEY")
    monkeypatch.delenv("KVSTORE_CURVE_CLIENT_KEY")
    bare = kvstore_cli("stats", "--address", f"tcp://127.0.0.1:{port}", "--timeout", "1")
    assert bare.returncode == 1 and bare.stderr.strip().splitlines() == [bare.stderr.strip()]
    assert "requires CURVE authentication" in bare.stderr and "no kvstore daemon" not in bare.stderr


# -- another user ------------------------------------------------------------------------------------------

def _denied(action) -> str:
    try:
        action()
    except PermissionError:
        return "denied"
    except OSError as exc:
        return f"error {errno.errorcode.get(exc.errno, exc.errno)}"
    except kvstore.DaemonUnavailable:
        return "unavailable"
    return "allowed"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a probe as another user")
def test_another_user_cannot_connect_or_map(start_daemon):
    other = pwd.getpwnam("nobody")
    workdir = short_tempdir()
    os.chmod(workdir, 0o755)  # the directory lets anyone in: only the files' own modes protect them
    d = start_daemon(workdir=workdir)
    with d.client(namespace="t") as c:
        c.put(c.chunk_keys(list(range(256))), [b"secret" * 100])
    arena = arena_path_for(d.socket_path)
    files = [d.socket_path, arena, d.socket_path + ".lock"]
    for path in files:
        assert mode_of(path) & 0o077 == 0, f"{path} is mode {mode_of(path):o}"

    def probe() -> list[str]:
        def connect_unix() -> None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(d.socket_path)
            finally:
                s.close()

        def connect_client() -> None:
            kvstore.connect(d.address, namespace="t", timeout=1, use_arena=False).close()

        return [
            "unix " + _denied(connect_unix),
            "client " + _denied(connect_client),
            "arena " + _denied(lambda: open(arena, "rb").close()),
            "lock " + _denied(lambda: open(d.socket_path + ".lock", "rb").close()),
        ]

    assert as_other_user(other.pw_uid, other.pw_gid, probe) == [
        "unix denied", "client unavailable", "arena denied", "lock denied"]


# -- one client cannot touch another's pins -----------------------------------------------------------------

def test_clients_cannot_touch_each_others_leases_or_reservations(daemon):
    with daemon.client(namespace="t") as a, daemon.client(namespace="t") as b:
        keys = a.chunk_keys(list(range(256 * 3)))
        a.put(keys[:2], [payload_for(k, 8192) for k in keys[:2]])
        lease = a.get(keys[:2])
        header, _ = a.request({"op": Op.RESERVE, "keys": keys[2:], "sizes": [4096]})
        rid = header["reservation"]
        for op, field, handle, error in [
            (Op.RELEASE, "lease", lease.id, kvstore.LeaseError),
            (Op.EXTEND, "lease", lease.id, kvstore.LeaseError),
            (Op.COMMIT, "reservation", rid, kvstore.ReservationError),
            (Op.ABORT, "reservation", rid, kvstore.ReservationError),
        ]:
            with pytest.raises(error):
                b.request({"op": op, field: handle})
        s = a.stats()
        assert s["leases"] == 1 and s["reservations"] == 1
        # Deleting and overwriting the keys does not disturb the bytes A holds under its lease.
        assert b.delete(keys[:2]) == 2
        b.put(keys[:2], [b"\x00" * 8192, b"\x00" * 8192])
        assert [bytes(v) for v in lease.views] == [payload_for(k, 8192) for k in keys[:2]]
        lease.release()
        assert a.request({"op": Op.ABORT, "reservation": rid})[0]["aborted"] == 1
