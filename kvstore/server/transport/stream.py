"""The local stream socket: requests of local clients on a Unix stream, one session per connection.

Why it exists and its framing: ``protocol/stream.py``. Each connection is its own session (it says HELLO first,
like a ZeroMQ peer) and owns the leases and reservations it takes; when the connection closes — the client closed
it or its process died — they are dropped at once, without waiting for the pid sweep or a TTL. Requests go
through the daemon's one dispatcher (``RequestDispatcher.handle_request``), so every check, bound and error reply
is the ZeroMQ socket's. The socket file is owner-only from its first moment, like the ZeroMQ one; with ``socket_group``
it is then given to that group (0660), so that other local users reach the daemon here, and only here: every
request on a connection is that connection's peer's (``SO_PEERCRED``), so its principal is known for all of them,
and a client that does not map the arena carries its PUT_INLINE payloads on this socket (``protocol/stream.py``).

Requests are handled as they are read (uvloop's ``data_received``); replies are written without waiting (the
transport buffers what the peer has not read). A request longer than ``MAX_HEADER_BYTES`` is not kept: its
length says where the next one starts, so its bytes are read and dropped as they come (all but its head, where
its id is) and it is answered, once it has all gone by, with the LimitError of any oversized request, through the
one dispatcher; the stream stays open. Only a length past ``SKIP_MAX`` is answered at once and the stream closed.
While the daemon stops, the listening socket is closed first (no new client) and reading is paused when the
daemon stops taking messages.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any, Protocol

from ... import logs
from ...errors import LimitError
from ...protocol.stream import (FRAMED, LENGTH, SUFFIX, framed_lengths, reply_bytes, reply_lengths,
                               request_too_long)
from ...protocol.wire import HINT_BYTES, MAX_HEADER_BYTES
from ...tenants.access import Principal, peer_principal



class Dispatcher(Protocol):
    """What the stream needs of the daemon: its one dispatcher (and its answer to a request too long to keep),
    the work a request leaves for after its reply, and dropping a closed connection's session."""

    def handle_request(self, transport: str, owner: bytes, raw_header: Any, payload: list[Any],
                       principal: Principal | None = None) -> Any: ...

    def refuse_request(self, transport: str, owner: bytes, head: bytes, length: int, exc: LimitError) -> list[Any]: ...

    def after_reply(self) -> None: ...

    def drop_session(self, owner: bytes, reason: str) -> None: ...

__all__ = ["StreamServer", "SUFFIX"]

# A request longer than this is no request a client could mean: it is not read past (that could take the
# stream for as long as the peer likes) but answered at once, and the stream closed.
SKIP_MAX = 64 * MAX_HEADER_BYTES


class StreamServer:
    def __init__(self, daemon: Dispatcher, path: str, tasks: set[asyncio.Task], frame_limit: int = 0,
                 group: int | None = None) -> None:
        self.daemon = daemon
        self.path = path
        self.frame_limit = frame_limit or MAX_HEADER_BYTES   # the largest payload frame kept (the largest chunk)
        self.group = group          # the socket_group given the socket file (None: the daemon's user alone)
        self.tasks = tasks          # replies that had to wait, as tasks (the daemon's stop waits for them)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[StreamConnection] = set()
        self._ids = itertools.count(1)

    async def start(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Listen; False (and a warning) when the path cannot be bound: clients then stay on ZeroMQ."""
        try:
            os.unlink(self.path)   # a crashed predecessor's (the caller holds the daemon lock)
        except FileNotFoundError:
            pass
        old_umask = os.umask(0o077)
        try:
            self._server = await loop.create_unix_server(lambda: StreamConnection(self), self.path)
        except OSError as exc:
            logs.warning("stream_socket_unavailable", path=self.path, reason=str(exc))
            return False
        finally:
            os.umask(old_umask)
        if self.group is not None:
            try:
                os.chown(self.path, -1, self.group)
                os.chmod(self.path, 0o660)   # the group's to connect to; never anyone else's
            except OSError as exc:
                self.close()
                logs.warning("stream_socket_unavailable", path=self.path, reason=f"socket_group: {exc.strerror}")
                return False
        return True

    @property
    def listening(self) -> bool:
        return self._server is not None

    def stop_accepting(self) -> None:
        """No new connections (the file goes too); open ones are still served."""
        if self._server is not None:
            self._server.close()
            self._server = None
            self.remove_file()

    def pause(self) -> None:
        for conn in list(self._connections):
            conn.transport.pause_reading()

    def close(self) -> None:
        self.stop_accepting()
        for conn in list(self._connections):
            conn.transport.abort()
        self._connections.clear()
        self.remove_file()

    def remove_file(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def next_owner(self) -> bytes:
        return b"s" + next(self._ids).to_bytes(8, "little")

    def opened(self, conn: "StreamConnection") -> None:
        """A connection is open: it is closed with the server."""
        self._connections.add(conn)

    def closed(self, conn: "StreamConnection") -> None:
        """A connection closed."""
        self._connections.discard(conn)


class StreamConnection(asyncio.Protocol):
    def __init__(self, server: StreamServer) -> None:
        self.server = server
        self.daemon = server.daemon
        self.owner = server.next_owner()
        self.transport: Any = None
        self.principal = Principal()
        self._buf = bytearray()
        self._oversized: Oversized | None = None   # a request too long to keep, being read past
        self._waiting: int | None = None   # the size of the framed request at the front of the buffer, once known

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        try:
            self.principal = peer_principal(sock) if sock is not None else Principal()
        except OSError:
            self.principal = Principal()   # unknown: a restricted tenant's namespaces stay closed to it
        self.server.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.closed(self)
        self.daemon.drop_session(self.owner, "connection_closed")

    def data_received(self, data: bytes) -> None:
        while data:
            if self._oversized is not None:
                data = self._read_past(data)
                continue
            if not self._buf and len(data) >= 4 and LENGTH.unpack_from(data)[0] == len(data) - 4:
                self._dispatch(data[4:])       # the common case: exactly one request
                return
            self._buf += data
            data = b""
            while len(self._buf) >= 4:
                buf = self._buf   # a framed request may take the buffer itself (_framed): read it again each time
                (length,) = LENGTH.unpack_from(buf)
                if length & FRAMED:
                    step = self._framed(buf)
                    if step is None:
                        return
                    if step:
                        data = step
                        break
                    continue
                if length > SKIP_MAX:
                    self._refuse_unskippable(length)
                    return
                if request_too_long(length):
                    self._oversized = Oversized(length)
                    data = bytes(buf[4:])
                    buf.clear()
                    break
                if len(buf) < 4 + length:
                    return
                header = bytes(buf[4:4 + length])
                del buf[:4 + length]
                self._dispatch(header)

    def _framed(self, buf: bytearray) -> bytes | None:
        """Take the framed request (header and payload frames) at the front of ``buf``: dispatch it and return b""
        when it is all there, None when more is to come (or the stream was closed), or — a request too long to keep
        — start reading past it and return its bytes in ``buf`` (the caller goes on with them)."""
        if self._waiting is not None and len(buf) < self._waiting:
            return None   # a large put still arriving: its lengths were read and checked already
        try:
            lengths = framed_lengths(buf)
        except ValueError as exc:
            self._refuse_unskippable(len(buf), str(exc))
            return None
        if lengths is None:
            return None
        start, total = 4 + 4 * len(lengths), sum(lengths)
        problem = self._framed_problem(lengths)
        self._waiting = None
        if problem is not None:
            if total > SKIP_MAX + self.server.frame_limit:
                self._refuse_unskippable(total, problem)
                return None
            self._oversized = Oversized(total, problem)
            rest = bytes(buf[start:])
            buf.clear()
            return rest or None
        if len(buf) < start + total:
            self._waiting = start + total
            return None
        if len(buf) == start + total:   # the buffer holds this request alone: its frames are views of it, no copy
            whole = memoryview(buf)[start:]
            self._buf = bytearray()
        else:
            whole = memoryview(bytes(memoryview(buf)[start:start + total]))
            del buf[:start + total]
        frames, pos = [], 0
        for n in lengths:
            frames.append(whole[pos:pos + n])
            pos += n
        self._dispatch(frames[0], frames[1:])
        return b""

    def _framed_problem(self, lengths: tuple[int, ...]) -> str | None:
        """Why a framed request is not kept (its header or a payload frame too long), or None."""
        if request_too_long(lengths[0]):
            return f"request of {lengths[0]} bytes exceeds the limit of {MAX_HEADER_BYTES}"
        for i, n in enumerate(lengths[1:]):
            if n > self.server.frame_limit:
                return f"payload frame {i} is {n} bytes; the largest chunk accepted is {self.server.frame_limit}"
        return None

    def _read_past(self, data: bytes) -> bytes:
        """Drop the oversized request's bytes in ``data``, answering it once all of it has gone by (as any request
        is answered after it is read: a client files a reply only once its request is sent); returns what follows
        it."""
        big = self._oversized
        assert big is not None
        rest = big.take(data)
        if big.remaining == 0:
            self._oversized = None
            self._refuse(big)
        return rest

    def _dispatch(self, header: bytes | memoryview, payloads: list[memoryview] | None = None) -> None:
        reply = self.daemon.handle_request("ipc", self.owner, header, payloads or [], self.principal)
        if type(reply) is not list:   # a coroutine: the handler has to wait
            task = asyncio.get_running_loop().create_task(self._reply_later(reply))
            self.server.tasks.add(task)
            task.add_done_callback(self.server.tasks.discard)
        else:
            self.write(reply)
            self.daemon.after_reply()

    async def _reply_later(self, pending: Any) -> None:
        self.write(await pending)
        self.daemon.after_reply()

    def write(self, frames: list[Any]) -> None:
        if self.transport.is_closing():
            return
        if len(frames) == 1:
            self.transport.write(reply_bytes(frames))
        else:   # payloads (an inline get): gathered by the transport's one write, not joined into a copy first
            self.transport.writelines([reply_lengths(frames), *frames])

    def _refuse(self, big: "Oversized") -> None:
        """Answer a request that was too long to keep, as the dispatcher answers any refused header: its head
        goes in its place, with the refusal, so the reply carries its id and the refusal is logged."""
        exc = LimitError(big.problem or f"request of {big.length} bytes exceeds the limit of {MAX_HEADER_BYTES}")
        self.write(self.daemon.refuse_request("ipc", self.owner, bytes(big.head), big.length, exc))

    def _refuse_unskippable(self, length: int, problem: str = "") -> None:
        """A length past any request's (``SKIP_MAX``), or a framed request no client sends: not worth reading past;
        answer it and close."""
        self._buf.clear()
        problem = problem or f"request of {length} bytes exceeds the limit of {MAX_HEADER_BYTES}"
        exc = LimitError(f"{problem}; closing the stream")
        self.write(self.daemon.refuse_request("ipc", self.owner, b"", length, exc))
        self.transport.close()


class Oversized:
    """A request longer than the daemon keeps: how much of it is still to come, and its head."""

    def __init__(self, length: int, problem: str = "") -> None:
        self.length = length
        self.problem = problem   # why it is not kept, for the reply (empty: its header is too long)
        self.remaining = length
        self.head = bytearray()

    def take(self, data: bytes) -> bytes:
        """Consume this request's part of ``data`` (keeping the first ``HINT_BYTES``); return the rest."""
        n = min(len(data), self.remaining)
        if len(self.head) < HINT_BYTES:
            self.head += data[:min(n, HINT_BYTES - len(self.head))]
        self.remaining -= n
        return data[n:]
