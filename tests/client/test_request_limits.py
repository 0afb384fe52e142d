"""Requests of too many keys get one LimitError at once, whatever their size (issue 24, item 3).

The client refuses them before anything is sent or copied; the daemon, asked by a peer that does not check
(raw requests on its ZeroMQ socket and its stream socket here), answers the request's own id — even when the
header is too large to decode or to keep — keeps the connection, and logs one ``request_refused`` line.

"At once" is shown without timing: the clients wait at most ``SHORT`` seconds (more than a loaded machine needs), so a
request left unanswered would surface as DaemonUnavailable, not LimitError.
"""

from __future__ import annotations

import os

import pytest

import kvstore
from kvstore.client.stream_transport import StreamTransport
from kvstore.client.transport import Transport
from kvstore.protocol.stream import SUFFIX
from kvstore.protocol.wire import MAX_BATCH, PROTOCOL_VERSION, Op
from harness.workload import free_port

SHORT = 10.0
SIZES = (MAX_BATCH + 1, 2 * MAX_BATCH + 1, 100_000)   # past the batch, past msgpack's array bound, past 1 MiB


@pytest.fixture(scope="module")
def daemon():
    from harness.daemons import Daemons

    port = free_port()
    with Daemons() as ds:
        d = ds.start("--tcp", f"127.0.0.1:{port}", "--disk-size", "0")
        d.tcp = f"tcp://127.0.0.1:{port}"
        yield d


def _call(client: kvstore.Client, op: str, keys: list[bytes]) -> None:
    if op == "put":
        client.put(keys, [b"x"] * len(keys))
    elif op == "get":
        client.get(keys)
    elif op == "get_into":
        client.get_into(keys, [bytearray(1)] * len(keys))
    elif op == "delete":
        client.delete(keys)
    else:
        client.lookup(keys)


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_every_oversized_call_gets_the_same_limit_error_and_the_client_keeps_working(daemon, transport):
    address = daemon.address if transport == "ipc" else daemon.tcp
    with kvstore.connect(address, namespace="limits", timeout=SHORT) as c:
        for n in SIZES:
            keys = [os.urandom(16) for _ in range(n)]
            for op in ("put", "get", "get_into", "delete", "lookup"):
                with pytest.raises(kvstore.LimitError, match=f"{n} keys in one call; the limit per request is "
                                                             f"{MAX_BATCH}"):
                    _call(c, op, keys)
        keys = [os.urandom(16) for _ in range(MAX_BATCH)]
        assert c.put(keys, [b"y"] * MAX_BATCH) == MAX_BATCH   # the limit itself is served
        assert c.lookup(keys) == MAX_BATCH


def _hello(transport) -> None:
    transport.call({"op": Op.HELLO, "version": PROTOCOL_VERSION, "namespace": "raw", "client_id": "raw-peer"})


def _raw_requests() -> list[tuple[str, dict]]:
    """Requests no client of ours sends: too many keys as a list (past the header's array bound), packed (past
    the batch) and packed past the header's size bound."""
    key = b"k" * 16
    return [("list", {"op": Op.DELETE, "keys": [key] * (2 * MAX_BATCH + 1)}),
            ("sizes", {"op": Op.RESERVE, "keys": key * 9000, "sizes": [1] * 9000}),
            ("packed", {"op": Op.GET, "keys": key * (MAX_BATCH + 1)}),
            ("huge", {"op": Op.LOOKUP, "keys": key * 100_000})]


@pytest.mark.parametrize("socket_kind", ["zmq-ipc", "zmq-tcp", "stream"])
def test_the_daemon_answers_an_oversized_request_to_its_id_and_keeps_the_connection(daemon, socket_kind):
    if socket_kind == "stream":
        transport = StreamTransport(daemon.socket_path + SUFFIX, SHORT)
    else:
        transport = Transport(daemon.address if socket_kind == "zmq-ipc" else daemon.tcp, SHORT)
    try:
        _hello(transport)
        for _name, request in _raw_requests():
            with pytest.raises(kvstore.LimitError):
                transport.call(request)
            transport.call({"op": Op.PING})   # the same connection, still served
    finally:
        transport.close()
    refused = [line for line in daemon.log().splitlines() if "event=request_refused" in line]
    assert refused and all("client=raw-peer" in line for line in refused[-len(_raw_requests()):]), refused
    assert any("header_bytes=1600" in line and "op=lookup" in line for line in refused), refused


def test_a_flood_of_refusals_is_logged_ten_lines_a_second_and_counted(caplog):
    from kvstore.errors import LimitError
    from kvstore.server.transport.refusals import PER_SECOND, RefusalLog

    now = [100.0]
    refusals = RefusalLog(clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="kvstore"):
        for _ in range(3 * PER_SECOND):
            refusals.note("tcp", None, Op.GET, 70_000, LimitError("too many keys"))
        now[0] += 1.0
        refusals.note("tcp", None, None, 70_000, LimitError("too many keys"))
    lines = [r.getMessage() for r in caplog.records if "event=request_refused" in r.getMessage()]
    assert len(lines) == PER_SECOND + 1 and refusals.refused == 3 * PER_SECOND + 1
    assert "op=get" in lines[0] and "client=-" in lines[0]
    assert f"unlogged={2 * PER_SECOND}" in lines[-1] and "op=-" in lines[-1]
