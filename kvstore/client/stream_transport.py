"""The client end of the local stream socket (``protocol/stream.py``): the Transport interface on a Unix stream.

Requests are written with one ``sendall`` (an inline put's payloads after its header: ``protocol/stream.py``);
replies are read by whichever caller waits, matched by id like on ZeroMQ (a reply that had to wait in the daemon
may overtake an earlier one). Replies to requests sent without
waiting (a lease release, lookup notes) are read and dropped on the next send or wait, so they never pile up.

A closed or reset stream (the daemon stopped or restarted) raises ``StreamLost``, a ConnectionLost: the client
then says hello again — on ZeroMQ, which also hands out the new stream — and retries the request once.
"""

from __future__ import annotations

import select
import socket
import time
from typing import Any

from ..errors import DaemonUnavailable
from ..protocol.stream import reply_layout, request_parts, split_frames
from ..protocol.wire import decode_header, encode
from .transport_base import ConnectionLost, RequestTransport


# A lookup answered from the shared index first asks whether the daemon is still there: a read of the socket, a
# system call that is a large share of such a lookup's cost, more so in a scheduler that wakes up between passes
# with cold caches (``bench/client_throughput.py``). One read per 10 ms answers for the lookups in between: a
# daemon that died within them answers as it stood when it died. That is stale, never wrong: its index and arena
# are files of its own (a restarted daemon creates new ones), which nothing writes any more, and 10 ms is far less
# than a daemon's start takes.
ALIVE_READ_S = 0.01


IOV_MAX = 1024   # the most buffers one sendmsg takes on Linux


def _byte_view(buf: Any) -> memoryview:
    """A flat view of ``buf``'s bytes, as ``sendmsg`` takes them."""
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _drop_sent(data: list[memoryview], sent: int) -> None:
    """Take the ``sent`` bytes a write took off the front of ``data``."""
    while sent:
        head = data[0]
        if sent < head.nbytes:
            data[0] = head[sent:]
            return
        sent -= head.nbytes
        data.pop(0)
    while data and not data[0].nbytes:
        data.pop(0)


class StreamLost(ConnectionLost):
    """The stream socket closed under a request."""


class StreamTransport(RequestTransport):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__(path, timeout)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)   # sends and receives never block; waits are select() with a deadline
        self._buf = bytearray()
        self._held = bytearray()   # requests without a reply that go out with the next request
        self.lost = False
        self._alive_at = 0.0   # time.monotonic() of the last read that found the daemon's end open

    def send(self, header: dict[str, Any], payloads: list[Any] | None = None, timeout: float | None = None,
             want_reply: bool = True, hold: bool = False) -> int:
        """Write one request (with any held one before it, in one write). ``hold`` (a request whose reply is not
        wanted, made right before another): keep it to go out with that next request, so the daemon wakes once
        for both (a woken daemon preempts the sender on a busy host); a second held one writes both."""
        rid = next(self._ids)
        # the id first: see Transport.send. Payloads (an inline put) follow the header, written as they are.
        parts = request_parts(encode({"id": rid, **header}), payloads or ())
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._lock:
            self._check()
            if hold and not want_reply and not self._held and len(parts) == 1:
                self._held += parts[0]
                return rid
            if self._held:
                parts[0], self._held = self._held + parts[0], bytearray()
            if want_reply:   # before the write: a refusal can come back while the rest is still being written
                self._outstanding.add(rid)
            try:
                self._send_all([_byte_view(p) for p in parts], deadline)
            except DaemonUnavailable:
                self._outstanding.discard(rid)
                raise
            if not want_reply:
                self._read_available()
        return rid

    def _send_all(self, data: list[memoryview], deadline: float) -> None:
        """Write ``data`` (buffers, one after the other) whole: gathered by ``sendmsg``, at most ``IOV_MAX`` a call."""
        while data:
            try:
                # one buffer (every request but an inline put): a plain send, which costs less than a sendmsg
                sent = self._sock.send(data[0]) if len(data) == 1 else self._sock.sendmsg(data[:IOV_MAX])
                _drop_sent(data, sent)
            except (BlockingIOError, InterruptedError):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DaemonUnavailable(f"kvstore daemon at {self.address} is not reading its stream") from None
                select.select([], [self._sock], [], min(remaining, 0.02))
                self._read_available()   # the daemon may be waiting for us to read its replies
            except OSError as exc:
                self._lose(exc)

    def wait(self, rid: int, timeout: float | None = None) -> tuple[dict[str, Any], list[Any]]:
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            with self._lock:
                reply = self._pending.pop(rid, None)
                if reply is None:
                    self._check()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self._outstanding.discard(rid)
                        raise DaemonUnavailable(f"kvstore daemon at {self.address} did not answer within {limit:.1f}s")
                    if not self._read_available():
                        select.select([self._sock], [], [], min(remaining, 0.02))
                        self._read_available()
                    reply = self._pending.pop(rid, None)
                if reply is not None:
                    self._outstanding.discard(rid)
                    break
        return self._answer(reply)

    @property
    def holding(self) -> bool:
        """Whether a held request waits for the next one to go out with (``send(hold=True)``)."""
        return bool(self._held)

    def alive(self) -> bool:
        """Whether the daemon still holds its end (one non-blocking read: a dead daemon's end reads as closed),
        read at most once per ``ALIVE_READ_S``. Replies waiting in the socket are filed on the way."""
        if self.lost:
            return False
        if time.monotonic() - self._alive_at < ALIVE_READ_S:
            return True
        with self._lock:
            try:
                self._read_available()
            except StreamLost:
                return False
            self._alive_at = time.monotonic()
            return True

    def close(self) -> None:
        self.lost = True
        self._sock.close()

    # -- reading (lock held) ------------------------------------------------------------------------------
    def _read_available(self) -> bool:
        """Read what the socket has now and file the complete replies; True if any arrived."""
        got = False
        while True:
            try:
                data = self._sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._lose(exc)
            if not data:
                self._lose(None)
            self._buf += data
            got = True
        while True:
            try:
                layout = reply_layout(self._buf)
            except ValueError as exc:
                self._lose(exc)
            if layout is None:
                return got
            frames = self._take_reply(*layout)
            header = decode_header(frames[0])
            if header.get("id") in self._outstanding:
                self._pending[header["id"]] = [header] + frames[1:]

    def _take_reply(self, lengths: tuple[int, ...], start: int, end: int) -> list[memoryview]:
        """Take the complete reply at the front of the buffer off it: views of its frames. A buffer that holds this
        reply alone (an inline get's chunks, say) is handed over whole rather than copied."""
        if end == len(self._buf):
            whole, self._buf = memoryview(self._buf), bytearray()
        else:
            whole = memoryview(bytes(memoryview(self._buf)[:end]))
            del self._buf[:end]
        return split_frames(whole, lengths, start)

    def _check(self) -> None:
        if self.lost:
            raise StreamLost(f"the stream socket {self.address} is closed")

    def _lose(self, exc: BaseException | None) -> None:
        self.lost = True
        raise StreamLost(f"the stream socket {self.address} closed: {exc or 'end of stream'}") from exc
