"""Two Unix users on one daemon: a tenant that lists uid 0 only, and a client running as ``nobody`` that the
operator let reach the stream socket. Its principal is the kernel's (``SO_PEERCRED``): every write, delete and
clear of the tenant's namespace is refused with PermissionDeniedError, and its lookups and gets of the tenant's
chunks miss, whichever namespace it says hello in; a reload is refused to it."""

from __future__ import annotations

import os
import pwd

import pytest

import kvstore
from kvstore.client.stream_transport import StreamTransport
from kvstore.protocol.stream import SUFFIX
from kvstore.protocol.wire import PROTOCOL_VERSION, Op

from support.daemons import short_tempdir
from support.users import as_other_user

pytestmark = pytest.mark.integration


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
