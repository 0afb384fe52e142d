"""Which ``tcp://`` connection each session came on, so that a session ends when its connection does.

A local client's session ends when its stream socket closes or its process dies; a ``tcp://`` client has neither
for the daemon to see. ZeroMQ hides connections behind the ROUTER socket, but it reports two things that together
name them: the file descriptor each message was read from (``SRCFD``, noted at hello) and, on a monitor socket,
every connection accepted and closed with its descriptor. When a connection closes — the client closed it, its
process died, or it stopped answering ZMTP heartbeats (``--tcp-heartbeat``: a host that vanished, a partition) —
the session that said hello on it is dropped: its leases and reservations are freed and its engine is no longer
published for (KV cache events).

A descriptor is reused by the next connection accepted once the old one is closed. The monitor reports the close
before the accept, and both before any message of the new connection can be read, so the monitor is drained
before every drain of the ROUTER (``poll``): a close always reaches the session it ended, never its successor.
"""

from __future__ import annotations

import asyncio
from typing import Callable, cast

import zmq
from zmq.utils.monitor import parse_monitor_message

HEARTBEAT_TIMEOUTS = 3   # heartbeats a peer may miss before its connection is closed


def set_heartbeat(sock: zmq.Socket, interval_s: float) -> None:
    """Ping every peer of ``sock`` each ``interval_s`` seconds; close a connection silent for three of them."""
    interval_ms = max(1, round(interval_s * 1000))
    sock.setsockopt(zmq.HEARTBEAT_IVL, interval_ms)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, interval_ms * HEARTBEAT_TIMEOUTS)


class TcpPeers:
    """The sessions of one ``tcp://`` ROUTER socket, by the connection they said hello on.

    Args:
        sock: the bound ROUTER socket (it gets a monitor).
        closed: called with a session's owner and the reason when its connection closes.
    """

    EVENTS = zmq.EVENT_DISCONNECTED

    def __init__(self, sock: zmq.Socket, closed: Callable[[bytes, str], None]) -> None:
        self._closed = closed
        self._monitor = sock.get_monitor_socket(self.EVENTS)
        self._sock = sock
        self._owner_of: dict[int, bytes] = {}   # connection's descriptor -> the session that said hello on it
        self._fd_of: dict[bytes, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Drop sessions as their connections close, also while no request arrives."""
        self._loop = loop
        loop.add_reader(cast(int, self._monitor.getsockopt(zmq.FD)), self.poll)
        loop.call_soon(self.poll)

    def follow(self, owner: bytes, frame: zmq.Frame) -> None:
        """``owner`` has a session and sent ``frame``: the session ends with the connection the frame came on
        (noted once; a message of a session already followed costs one dict lookup)."""
        if owner in self._fd_of:
            return
        fd = frame.get(zmq.SRCFD)
        if fd < 0:
            return
        previous = self._owner_of.get(fd)
        if previous is not None:
            self._fd_of.pop(previous, None)
        self._owner_of[fd] = owner
        self._fd_of[owner] = fd

    def forget(self, owner: bytes) -> None:
        """``owner``'s session ended otherwise (a new hello, a dropped session)."""
        fd = self._fd_of.pop(owner, None)
        if fd is not None and self._owner_of.get(fd) == owner:
            del self._owner_of[fd]

    def poll(self) -> None:
        """Read every connection close reported so far and drop the session each ended (run before each drain
        of the ROUTER socket, and whenever the monitor has news)."""
        while cast(int, self._monitor.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)
            if event["event"] != zmq.EVENT_DISCONNECTED:
                continue
            owner = self._owner_of.pop(event["value"], None)
            if owner is not None:
                self._fd_of.pop(owner, None)
                self._closed(owner, "connection_closed")

    def sessions(self) -> int:
        """How many sessions are followed (for tests and stats)."""
        return len(self._fd_of)

    def close(self) -> None:
        """Stop following connections (the ROUTER socket is closed by its owner)."""
        if self._loop is not None and not self._monitor.closed:
            self._loop.remove_reader(cast(int, self._monitor.getsockopt(zmq.FD)))
        if not self._sock.closed:
            self._sock.disable_monitor()
        self._monitor.close(linger=0)
