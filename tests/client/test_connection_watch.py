"""How a tcp:// client names a refused handshake, whatever order its reconnects' events arrive in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from kvstore.client.connection_watch import ConnectionWatch

ADDRESS = "tcp://127.0.0.1:1"
MISMATCH = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
BROKEN_PIPE = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32)


@pytest.fixture
def watch() -> Iterator[ConnectionWatch]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    w = ConnectionWatch(sock)
    yield w
    w.close()
    sock.close(linger=0)
    ctx.term()


def test_a_retry_cut_short_never_hides_the_daemons_reason(watch: ConnectionWatch) -> None:
    watch.record(*MISMATCH)
    watch.record(*BROKEN_PIPE)   # the next reconnect: the daemon closed before its reason arrived
    assert "requires CURVE authentication" in (watch.explain(ADDRESS, has_curve=False) or "")
    assert "does not use CURVE" in (watch.explain(ADDRESS, has_curve=True) or "")


def test_a_keyless_client_cut_short_every_time_is_still_pointed_at_curve(watch: ConnectionWatch) -> None:
    watch.record(*BROKEN_PIPE)
    assert "likely requires CURVE authentication; set KVSTORE_CURVE" in (watch.explain(ADDRESS, False) or "")


def test_a_successful_handshake_clears_an_old_failure(watch: ConnectionWatch) -> None:
    watch.record(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)
    watch.record(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)
    watch.record(zmq.EVENT_CONNECTED, 0)
    assert "no kvstore daemon answered" in (watch.explain(ADDRESS, False) or "")
