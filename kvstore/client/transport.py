"""A ZeroMQ DEALER with request ids: many requests in flight, replies matched by id.

Sends never block on a daemon that is not there: the socket is ``IMMEDIATE`` (nothing is queued for a peer
that is not connected) and sends are non-blocking, so a dead daemon shows up as DaemonUnavailable within the
timeout rather than a hang, and at once when an ipc:// socket file does not exist (no daemon listens there: a
stopping daemon removes it first). A reply that arrives after its caller gave up is dropped by id.

Every failure surfaces as a ``KVStoreError``: ZeroMQ errors become ``DaemonUnavailable`` (chained), a call after
``close()`` is ``ClientClosedError``, and on tcp:// a send that times out says why when a daemon was reached
but the CURVE handshake failed (``connection_watch.py``). On tcp:// a request whose connection closed before its
reply came raises ``ConnectionLost`` as soon as the reply is late (ZeroMQ drops what was sent on a closed
connection; the session says hello again and retries), rather than waiting out the timeout.
"""

from __future__ import annotations

import os
import time
from typing import Any

import zmq

from ..errors import ClientClosedError, DaemonUnavailable, UsageError
from ..protocol.wire import decode_header, encode
from ..security.curve import ClientCurve
from .connection_watch import ConnectionWatch
from .transport_base import ConnectionLost, RequestTransport


class Transport(RequestTransport):
    def __init__(self, address: str, timeout: float, curve: ClientCurve | None = None) -> None:
        super().__init__(address, timeout)
        self._ctx: zmq.Context = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        # CURVE keys for tcp://: given, else from the KVSTORE_CURVE_* variables (see security/curve.py)
        self.curve = (curve or ClientCurve.from_env()) if address.startswith("tcp://") else None
        if self.curve is not None:
            self.curve.apply(self._sock)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        self._sock.setsockopt(zmq.RECONNECT_IVL, 50)
        self._sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        self.closed = False
        self._watch = ConnectionWatch(self._sock) if address.startswith("tcp://") else None
        self._drops_at_send: dict[int, int] = {}   # tcp://: connections closed before each waited request went out
        try:
            self._sock.connect(address)
        except zmq.ZMQError as exc:
            self.close()
            raise UsageError(f"{address!r} is not a valid address (expected ipc:///path/to/kvstore.sock or "
                             f"tcp://HOST:PORT): {exc.strerror}") from exc
        self._ipc_path = address[len("ipc://"):] if address.startswith("ipc://") else None

    def send(self, header: dict[str, Any], payloads: list[Any] | None = None, timeout: float | None = None,
             want_reply: bool = True, hold: bool = False) -> int:
        """Send a request; return its id. Retries while no connection is up, until the timeout.

        With ``want_reply=False`` the reply is dropped when it arrives (for requests whose outcome the caller
        cannot act on, such as releasing a lease); requests on one connection are handled in order, so a later
        request still sees its effect.
        ``hold`` is for the stream socket's benefit (``stream_transport.py``); ZeroMQ sends each message at once.
        """
        self._check_open()
        rid = next(self._ids)
        # The id first: a refusal of an oversized request names it (``wire.header_hints``)
        frames = [encode({"id": rid, **header})] + list(payloads or [])
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._lock:
            while True:
                try:
                    self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=len(frames) == 1)
                    if want_reply:
                        self._outstanding.add(rid)
                        self._note_drops(rid)
                    return rid
                except zmq.Again:
                    if time.monotonic() >= deadline or self._no_socket_file():
                        raise DaemonUnavailable(self._why_unreachable()) from None
                    time.sleep(0.005)
                except zmq.ZMQError as exc:
                    raise self._error(exc) from exc

    def _no_socket_file(self) -> bool:
        """No connection is up and no daemon can be listening: waiting out the timeout would gain nothing."""
        return self._ipc_path is not None and not os.path.exists(self._ipc_path)

    def wait(self, rid: int, timeout: float | None = None) -> tuple[dict[str, Any], list[Any]]:
        """Block until the reply to ``rid`` arrives; raise its error if it is an error reply."""
        self._check_open()
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            # The lock is held for one short poll at a time, so other threads can send in between.
            with self._lock:
                if rid in self._pending:
                    self._give_up(rid)
                    reply = self._pending.pop(rid)
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._give_up(rid)
                    raise DaemonUnavailable(f"kvstore daemon at {self.address} did not answer within {limit:.1f}s")
                try:
                    if self._sock.poll(min(int(remaining * 1000) + 1, 20), zmq.POLLIN):
                        self._receive_one()
                    elif self._lost_with_its_connection(rid):
                        self._give_up(rid)
                        raise ConnectionLost(f"the connection to the kvstore daemon at {self.address} closed before "
                                             f"it answered")
                except zmq.ZMQError as exc:
                    raise self._error(exc) from exc
        return self._answer(reply)

    def _note_drops(self, rid: int) -> None:
        """tcp://: note how many connections had closed when ``rid`` went out (the monitor read first, so that a
        close already reported is not taken for one under this request)."""
        if self._watch is not None:
            self._watch.poll()
            self._drops_at_send[rid] = self._watch.drops

    def _lost_with_its_connection(self, rid: int) -> bool:
        """tcp://: whether a connection closed since ``rid`` went out (its reply may never come)."""
        if self._watch is None:
            return False
        self._watch.poll()
        return self._watch.drops > self._drops_at_send.get(rid, self._watch.drops)

    def _give_up(self, rid: int) -> None:
        """``rid`` is answered or given up on: a late reply to it is dropped."""
        self._outstanding.discard(rid)
        self._drops_at_send.pop(rid, None)

    def _receive_one(self) -> None:
        frames = self._sock.recv_multipart(copy=False)
        header = decode_header(frames[0].buffer)
        got = header.get("id")
        if got in self._outstanding:
            self._pending[got] = [header] + frames[1:]

    def _check_open(self) -> None:
        if self.closed:
            raise ClientClosedError(f"this client of {self.address} is closed; connect again")

    def _error(self, exc: zmq.ZMQError) -> Exception:
        if self.closed or self._sock.closed:
            return ClientClosedError(f"this client of {self.address} is closed; connect again")
        return DaemonUnavailable(f"talking to the kvstore daemon at {self.address} failed: {exc}")

    def _why_unreachable(self) -> str:
        found = self._watch.explain(self.address, self.curve is not None) if self._watch is not None else None
        return found or f"no kvstore daemon is accepting requests at {self.address}; {how_to_reach(self.address)}"

    def close(self) -> None:
        """Close the socket; idempotent. Later calls raise ClientClosedError."""
        self.closed = True
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._sock.close(linger=0)


def how_to_reach(address: str) -> str:
    """What to do when nothing listens at ``address``: start a daemon there, or name one that runs."""
    from ..defaults import default_socket

    if address.startswith("tcp://"):
        start = f"kvstore serve --tcp {address.removeprefix('tcp://')}"
    else:
        path = address.removeprefix("ipc://")
        start = "kvstore serve" if path == default_socket() else f"kvstore serve --socket {path}"
    return f"start one ({start}), or pass the address of a running one (--socket or --address of kvstore commands)"
