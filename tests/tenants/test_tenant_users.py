"""Two Unix users on one daemon: a tenant that lists uid 0 only, and a client running as ``nobody`` that the
operator let reach the stream socket. Its principal is the kernel's (``SO_PEERCRED``): every write, delete and
clear of the tenant's namespace is refused with PermissionDeniedError, and its lookups and gets of the tenant's
chunks miss, whichever namespace it says hello in; a reload is refused to it."""

from __future__ import annotations

import grp
import os
import pwd
import stat

import pytest

import kvstore
from kvstore.client.stream_transport import StreamTransport
from kvstore.protocol.stream import SUFFIX
from kvstore.protocol.wire import PROTOCOL_VERSION, Op
from kvstore.mapped.index_writer import index_path_for
from kvstore.mapped.arena import arena_path_for

from harness.daemons import short_tempdir
from support.users import as_other_user

pytestmark = pytest.mark.integration

STRANGER_UID = 65533   # a uid no tenant lists (it needs no passwd entry: setuid takes any number)


def _other_user() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user (setuid in a child)")
@pytest.mark.skipif(_other_user() is None, reason="no 'nobody' user to run the second client as")
def test_another_users_client_is_refused_and_misses(start_daemon, tmp_path):
    other = _other_user()
    assert other is not None
    config = tmp_path / "kvstore.toml"
    config.write_text('[tenants.admin]\nnamespaces = ["admin:"]\nuids = [0]\n')
    workdir = short_tempdir()
    os.chmod(workdir, 0o755)
    daemon = start_daemon("--config", str(config), "--host-mem", "16MiB", "--disk-size", "0", workdir=workdir)
    stream_path = daemon.socket_path + SUFFIX
    os.chmod(stream_path, 0o666)   # the operator lets the other user reach the stream socket
    with daemon.client(namespace="admin:m") as admin:   # uid 0: listed
        keys = [os.urandom(16) for _ in range(2)]
        admin.put(keys, [b"a" * 4096] * 2)
        assert admin.lookup(keys) == 2

    def probe() -> list[str]:
        lines = []
        for namespace in ("admin:m", "open:m"):
            stream = StreamTransport(stream_path, 10.0)
            try:
                stream.call({"op": Op.HELLO, "version": PROTOCOL_VERSION, "namespace": namespace,
                             "client_id": "nobody", "arena": False})
                for name, header in (
                        ("lookup", {"op": Op.LOOKUP, "keys": keys}),
                        ("get", {"op": Op.GET, "keys": keys}),
                        ("reserve", {"op": Op.RESERVE, "keys": keys, "sizes": [4096, 4096]}),
                        ("credit_put", {"op": Op.CREDIT_PUT, "keys": keys}),
                        ("put_inline", {"op": Op.PUT_INLINE, "keys": keys}),
                        ("delete", {"op": Op.DELETE, "keys": keys}),
                        ("clear", {"op": Op.CLEAR}),
                        ("reload", {"op": Op.RELOAD})):
                    try:
                        reply, _ = stream.call(header)
                        found = {k: reply[k] for k in ("count", "slots", "deleted", "cleared") if k in reply}
                        lines.append(f"{namespace} {name} ok {found}")
                    except kvstore.RequestError as exc:
                        lines.append(f"{namespace} {name} {type(exc).__name__}")
            finally:
                stream.close()
        return lines

    report = as_other_user(other.pw_uid, other.pw_gid, probe)
    refused = ("reserve", "credit_put", "put_inline", "delete", "clear", "reload")
    assert report[:8] == ["admin:m lookup ok {'count': 0}", "admin:m get ok {'slots': []}",
                          *(f"admin:m {op} PermissionDeniedError" for op in refused)], report
    # In an open namespace of its own, the admin tenant's chunks are still a miss, and not the other's to delete;
    # the daemon's tenants table is not the other user's to reload either.
    assert report[8:10] == ["open:m lookup ok {'count': 0}", "open:m get ok {'slots': []}"], report
    assert "open:m delete ok {'deleted': 0}" in report and "open:m clear ok {'cleared': 0}" in report, report
    assert report[-1] == "open:m reload PermissionDeniedError", report
    with daemon.client(namespace="admin:m") as admin:
        assert admin.lookup(keys) == 2   # nothing the other user did reached them


def _shared(*paths: str) -> list[str]:
    """What each file lets its group and everyone else do, and its group."""
    return [f"{oct(stat.S_IMODE(os.stat(p).st_mode) & 0o077)} {os.stat(p).st_gid}" for p in paths]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user (setuid in a child)")
@pytest.mark.skipif(_other_user() is None, reason="no 'nobody' user to run the second client as")
def test_a_socket_group_lets_other_users_in_through_the_stream_only(start_daemon, tmp_path):
    """``socket_group``: user ``nobody`` (in the group) is a restricted tenant's member and moves its own chunks
    inline on the stream socket, byte for byte (put, get, get_into, and reserve-fill-commit as engine connectors
    save), without ever being named the arena or the index (not even when
    the files' modes were loosened by mistake, nor over the ZeroMQ socket); it misses the daemon user's tenant's
    chunks. Another uid in the group but in no tenant gets the open namespaces only."""
    other = _other_user()
    assert other is not None
    group = grp.getgrgid(other.pw_gid).gr_name
    config = tmp_path / "kvstore.toml"
    config.write_text(f'socket_group = "{group}"\n'
                      f'[tenants.admin]\nnamespaces = ["admin:"]\nuids = [0]\n'
                      f'[tenants.guests]\nnamespaces = ["guest:"]\nuids = [{other.pw_uid}]\n')
    workdir = short_tempdir()
    os.chmod(workdir, 0o755)
    daemon = start_daemon("--config", str(config), "--host-mem", "16MiB", "--disk-size", "0", workdir=workdir)
    stream_path = daemon.socket_path + SUFFIX
    arena, index = arena_path_for(daemon.socket_path), index_path_for(daemon.socket_path)
    assert _shared(stream_path, daemon.socket_path, arena, index) == [f"0o60 {other.pw_gid}", "0o0 0", "0o0 0", "0o0 0"]
    keys = [os.urandom(16) for _ in range(2)]
    with daemon.client(namespace="admin:m") as admin:   # the daemon's user: maps the arena as before
        assert admin.server_info["arena"] is not None
        admin.put(keys, [b"a" * 4096] * 2)
    os.chmod(arena, 0o644)              # loosened by mistake: the daemon still names the files to nobody else
    os.chmod(daemon.socket_path, 0o666)
    chunks = [os.urandom(5000 + i) for i in range(3)]

    def member() -> list[str]:
        lines = []
        with kvstore.connect(daemon.address, namespace="guest:m", timeout=10.0) as c:
            info = c.server_info
            lines.append(f"stream {isinstance(c.transport, StreamTransport)} arena {info['arena']} "
                         f"index {info['index']} gpu {info['gpu']}")
            mine = c.chunk_keys(list(range(256 * 3)))
            lines.append(f"put {c.put(mine, chunks)} lookup {c.lookup(mine)}")
            with c.get(mine) as views:
                lines.append(f"get identical {[bytes(v) for v in views] == chunks}")
            outs = [bytearray(6000) for _ in chunks]
            lines.append(f"get_into {c.get_into(mine, outs)} "
                         f"identical {[bytes(o[:len(x)]) for o, x in zip(outs, chunks)] == chunks}")
            lines.append(f"admin's lookup {c.lookup(keys)} get {len(c.get(keys).views)}")
            more = c.chunk_keys(list(range(256 * 5)))[3:]   # as an engine connector saves: reserve, fill, commit
            reservation = c.reserve(more, [4096, 4096], parent=mine[-1])
            for i, view in enumerate(reservation.views):
                view[:] = bytes([i + 1]) * 4096
            lines.append(f"{type(reservation).__name__} commit {reservation.commit()}")
            with c.get(mine + more) as views:
                lines.append(f"chain {len(views)} reserved identical "
                             f"{[bytes(v) for v in views[3:]] == [bytes([1]) * 4096, bytes([2]) * 4096]}")
        with kvstore.connect(daemon.address, namespace="admin:m", timeout=10.0) as c:
            try:
                c.put([os.urandom(16)], [b"n" * 4096])
                lines.append("admin put ok")
            except kvstore.PermissionDeniedError:
                lines.append("admin put refused")
        with kvstore.connect(daemon.address, namespace="guest:m", timeout=10.0, stream=False) as c:
            lines.append(f"zeromq arena {c.server_info['arena']} index {c.server_info['index']}")
        return lines

    report = as_other_user(other.pw_uid, other.pw_gid, member)
    assert report == ["stream True arena None index None gpu None", "put 3 lookup 3", "get identical True",
                      "get_into 3 identical True", "admin's lookup 0 get 0", "InlineReservation commit 2",
                      "chain 5 reserved identical True", "admin put refused",
                      "zeromq arena None index None"], report
    os.chmod(arena, 0o600)
    os.chmod(daemon.socket_path, 0o600)
    with daemon.client(namespace="guest:m") as root:   # the guests' chunks are theirs: not even the daemon's user
        assert root.lookup(root.chunk_keys(list(range(256 * 3)))) == 0

    def stranger() -> list[str]:
        lines = []
        with kvstore.connect(daemon.address, namespace="guest:m", timeout=10.0) as c:
            lines.append(f"guest lookup {c.lookup(c.chunk_keys(list(range(256 * 3))))}")
            try:
                c.put([os.urandom(16)], [b"s" * 4096])
                lines.append("guest put ok")
            except kvstore.PermissionDeniedError:
                lines.append("guest put refused")
        with kvstore.connect(daemon.address, namespace="open:m", timeout=10.0) as c:
            mine = [os.urandom(16) for _ in range(2)]
            lines.append(f"open put {c.put(mine, chunks[:2])}")
            with c.get(mine) as views:
                lines.append(f"open get identical {[bytes(v) for v in views] == chunks[:2]}")
            lines.append(f"admin's lookup {c.lookup(keys)}")
        return lines

    report = as_other_user(STRANGER_UID, other.pw_gid, stranger)
    assert report == ["guest lookup 0", "guest put refused", "open put 2", "open get identical True",
                      "admin's lookup 0"], report
