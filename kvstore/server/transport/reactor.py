"""Requests off a ZeroMQ socket, on the event loop, without a future per message.

zmq.asyncio wraps every receive and send in futures and event bookkeeping, which costs tens of microseconds a
message — more than the daemon's own work on a lookup. The reactor instead watches the socket's file descriptor
with ``add_reader`` and, when it fires, drains the socket with non-blocking receives, handing each message to
the daemon and sending the reply at once (a ROUTER send never blocks: a reply to a peer that is gone or full is
dropped, as it would be anyway).

ZeroMQ's descriptor is edge-triggered: it signals only when the socket's state changes, so every wake-up must
drain until ``EVENTS`` shows no more input, and anything that sends from outside the drain (a reply that had
to wait) schedules one more drain, since sending can move queued input into view without a new edge. Drains
are cut into bursts so that a flood from one client cannot starve timers and other sockets.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, cast

import zmq

from ... import logs

BURST = 64

Handler = Callable[[str, list], Any]


class SocketReactor:
    def __init__(self, loop: asyncio.AbstractEventLoop, transport: str, sock: zmq.Socket,
                 handle: Handler, tasks: set[asyncio.Task], after_reply: Callable[[], None] = lambda: None,
                 before_drain: Callable[[], None] | None = None) -> None:
        self.loop = loop
        self._before_drain = before_drain   # news the socket's monitor has, read before its messages (tcp_peers.py)
        self._after_reply = after_reply   # what a request left for once its reply is sent
        self.transport = transport
        self.sock = sock
        self._handle = handle
        self._tasks = tasks
        self._fd = cast(int, sock.getsockopt(zmq.FD))
        self.active = False

    def start(self) -> None:
        self.active = True
        self.loop.add_reader(self._fd, self._drain)
        self.loop.call_soon(self._drain)  # input that arrived before the reader was added

    def stop(self) -> None:
        """Stop taking messages; what is queued stays in the socket (see ``answer_queued``)."""
        if self.active:
            self.active = False
            self.loop.remove_reader(self._fd)

    def _drain(self) -> None:
        if self._before_drain is not None:
            self._before_drain()
        for _ in range(BURST):
            if not self.active or not cast(int, self.sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                return
            try:
                msg = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._dispatch(msg)
        self.loop.call_soon(self._drain)

    def _dispatch(self, msg: list) -> None:
        reply = self._handle(self.transport, msg)
        if asyncio.iscoroutine(reply):
            task = self.loop.create_task(self._reply_later(reply))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif reply is not None:
            self.send(reply)
            self._after_reply()

    async def _reply_later(self, pending: Any) -> None:
        self.send(await pending)
        self._after_reply()
        if self.active:
            self.loop.call_soon(self._drain)

    def send(self, reply: list) -> None:
        try:
            self.sock.send_multipart(reply, flags=zmq.NOBLOCK, copy=len(reply) == 2)
        except zmq.Again:
            logs.warning("reply_dropped", transport=self.transport, reason="peer queue full")
        except zmq.ZMQError as exc:
            if exc.errno != zmq.ENOTSOCK:  # closed during shutdown
                logs.warning("reply_dropped", transport=self.transport, reason=str(exc))

    async def answer_queued(self, deadline: float) -> int:
        """Answer the messages already queued in the socket, without waiting for more (used when stopping)."""
        answered = 0
        while self.loop.time() < deadline:
            try:
                msg = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            reply = self._handle(self.transport, msg)
            if asyncio.iscoroutine(reply):
                reply = await reply
            if reply is not None:
                self.send(reply)
            answered += 1
        return answered
