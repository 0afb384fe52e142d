"""What happened to a tcp:// client's connection: the ZeroMQ socket monitor's handshake and disconnect events.

A CURVE daemon and a client that disagree never exchange a message: the handshake fails and the client's
socket simply has no peer to send to, which looks exactly like "no daemon here". The socket monitor tells the
cases apart: ``HANDSHAKE_FAILED_PROTOCOL`` with a mechanism mismatch (one side uses CURVE, the other does
not), ``HANDSHAKE_FAILED_AUTH`` (the daemon's ZAP handler refused the client's key) and
``HANDSHAKE_FAILED_NO_DETAIL`` (the client holds the wrong server key, so the daemon's reply cannot be
verified). The monitor is read only when a send times out, so it costs nothing per request; it runs on
tcp:// sockets only, where CURVE applies.

It also counts the connections that closed. ZeroMQ reconnects by itself, but what was sent on a connection as it
closed is gone with it: a request sent before the daemon dropped the connection (it stopped answering heartbeats, a
partition) waits in vain for its reply. A transport notes the count when it sends and, while a reply is late,
reads the monitor again: a higher count means the request may be lost (``transport.py``).
"""

from __future__ import annotations

import uuid
from typing import cast

import zmq
from zmq.utils.monitor import recv_monitor_message

EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
          | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_SUCCEEDED)
CURVE_HINT = ("KVSTORE_CURVE_SERVER_KEY (the daemon's server.key) and KVSTORE_CURVE_CLIENT_KEY (this client's "
              ".key_secret, whose .key is in the daemon's --curve-client-keys), or pass curve=ClientCurve.load(...)")


class ConnectionWatch:
    """The last handshake outcome of one socket and how many of its connections closed, read from its monitor on
    demand."""

    def __init__(self, sock: zmq.Socket) -> None:
        self._sock = sock
        self._monitor = sock.get_monitor_socket(EVENTS, addr=f"inproc://kvstore-monitor-{uuid.uuid4().hex}")
        self.connected = False
        self.failure: tuple[int, int] | None = None   # (event, value) of the last failed handshake
        self.drops = 0   # connections closed so far

    def poll(self) -> None:
        """Read what the monitor reported since the last poll (never blocks)."""
        while cast(int, self._monitor.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                msg = recv_monitor_message(self._monitor, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self.record(msg["event"], msg["value"])

    def record(self, event: int, value: int) -> None:
        """Take one monitor event into account.

        A refused handshake is retried on every reconnect, and a retry can end before the daemon's reason
        arrives (it closed first: ``NO_DETAIL``, a broken pipe). Such a retry never hides a reason already
        seen, so the explanation names the real cause however the retries raced.
        """
        if event == zmq.EVENT_CONNECTED:
            self.connected = True
        elif event == zmq.EVENT_DISCONNECTED:
            self.drops += 1
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.failure = None
        elif event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL or self.failure is None:
            self.failure = (event, value)

    def explain(self, address: str, has_curve: bool) -> str | None:
        """What went wrong at ``address``, if a daemon was reached at all; None if nothing answered there."""
        self.poll()
        if self.failure is None:
            if not self.connected:
                return None
            return f"something at {address} accepted the connection but no kvstore daemon answered"
        event, value = self.failure
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (f"the kvstore daemon at {address} refused this client's CURVE key: add its .key file to the "
                    f"daemon's --curve-client-keys")
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            if has_curve:
                return f"the kvstore daemon at {address} does not use CURVE; connect without CURVE keys"
            return f"the kvstore daemon at {address} requires CURVE authentication; set {CURVE_HINT}"
        if has_curve:
            return (f"the CURVE handshake with {address} failed: the server key this client holds is not that "
                    f"daemon's (KVSTORE_CURVE_SERVER_KEY must be its server.key)")
        # A client without keys fails a handshake only where the daemon speaks another mechanism: CURVE.
        return (f"the handshake with {address} failed (ZeroMQ event {event}, value {value}): the kvstore daemon "
                f"there likely requires CURVE authentication; set {CURVE_HINT}")

    def close(self) -> None:
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass   # the socket is already closed
        self._monitor.close(linger=0)
