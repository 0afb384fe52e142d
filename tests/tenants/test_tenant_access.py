"""The access rule over a real tenant table, and peer credentials read from a real Unix socket pair."""
from __future__ import annotations

import os
import socket

import zmq

from kvstore.server.lifecycle.local_access import may_map, zmq_peer_uid
from kvstore.tenants.access import Principal, may_access, peer_principal
from kvstore.tenants.table import parse_tenants

KEY_A = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"


def _table():
    return parse_tenants({
        "alpha": {"namespaces": ["alpha/*"], "uids": [1001], "curve_keys": [KEY_A]},
        "beta": {"namespaces": ["beta/*"], "gids": [2002]},
        "open": {"namespaces": ["open/*"]},
    })


def test_restricted_namespace_only_for_its_principals() -> None:
    table = _table()
    assert may_access(table, Principal(uid=1001), "alpha/m")
    assert may_access(table, Principal(curve_key=KEY_A), "alpha/m")
    assert not may_access(table, Principal(uid=1002, gid=2002), "alpha/m")
    assert may_access(table, Principal(uid=1002, gid=2002), "beta/m")
    assert not may_access(table, Principal(uid=1001), "beta/m")


def test_open_and_unmatched_namespaces_for_everyone() -> None:
    table = _table()
    for who in (Principal(uid=1001), Principal(uid=4242), Principal(curve_key="x" * 40), Principal()):
        assert may_access(table, who, "open/m")
        assert may_access(table, who, "nobody/m")


def test_no_tenants_is_todays_behaviour() -> None:
    assert may_access(parse_tenants({}), Principal(uid=4242), "anything")


def test_peer_principal_reads_socketpair_credentials() -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        assert peer_principal(left) == Principal(uid=os.getuid(), gid=os.getgid())


def test_only_the_daemons_user_and_root_may_map_its_files() -> None:
    stranger = 4242 if os.getuid() != 4242 else 4243
    assert may_map(Principal(uid=os.getuid(), gid=os.getgid()), "ipc")
    assert may_map(Principal(uid=0), "ipc")
    assert not may_map(Principal(uid=stranger), "ipc")
    assert not may_map(Principal(), "ipc")                 # a stream peer whose credentials could not be read
    assert may_map(None, "ipc")                            # ZeroMQ without a uid: its owner-only socket decides
    assert not may_map(Principal(uid=os.getuid()), "tcp")


def test_a_zeromq_ipc_frame_names_its_peers_uid(tmp_path) -> None:
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        router.bind(f"ipc://{tmp_path}/s")
        dealer.connect(f"ipc://{tmp_path}/s")
        dealer.send(b"hello")
        assert router.poll(5000)
        frame = router.recv_multipart(copy=False)[1]
        assert zmq_peer_uid(frame) == os.getuid()
        assert may_map(None, "ipc", frame)
        assert zmq_peer_uid(b"not a frame") is None
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()
