"""The daemon process: sockets, sessions, the request loop and the lifecycle.

Start: take an exclusive lock next to the socket (a second daemon on the same socket refuses to start; a
crashed daemon's lock dies with it, so its stale socket and arena are removed), create the shared arena, bind a
ZeroMQ ROUTER on ipc:// (and optionally tcp://), then serve. Requests are handled one at a time on the event
loop: every operation is an in-memory index update of a few microseconds, and bytes never pass through the
daemon on the ipc:// path (clients copy them straight into or out of the arena). A sweeper expires leases and
reservations and reclaims the pins of local clients whose process died.

Stop (SIGTERM or SIGINT): stop receiving, answer what was already received, close the sockets, remove the
socket file and the arena, exit 0.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import time
from typing import Any

import zmq
import zmq.asyncio

from .. import logs
from .._version import __version__
from ..config import ServerConfig
from ..errors import ConfigError, InternalError, RequestError, VersionError
from ..protocol.wire import Op, decode_header, error_reply, op_of, request_id_of
from ..store.store import Store
from ..tiers.arena import SharedArena, arena_path_for
from ..tiers.host import HostTier
from .handlers import HANDLERS, hello_reply
from .session import Session

SWEEP_INTERVAL = 0.25


class Daemon:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.sessions: dict[bytes, Session] = {}
        self.started = time.time()
        self.lookup_tokens = 0
        self.hit_tokens = 0
        self.requests = 0
        self.errors = 0
        self._lock_fd: int | None = None
        self._ctx = zmq.asyncio.Context()
        self._sockets: list[tuple[str, zmq.asyncio.Socket]] = []
        self.store: Store  # set in open()

    # -- lifecycle ------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Everything that can fail with a clear message before serving: lock, arena, sockets."""
        self._prepare_socket_dir()
        self._take_lock()
        arena = SharedArena.create(arena_path_for(self.config.socket), self.config.host_mem)
        self.store = Store(HostTier(arena), self.config.lease_ttl, self.config.reserve_ttl)
        self._bind("ipc", "ipc://" + self.config.socket)
        if self.config.tcp:
            self._bind("tcp", "tcp://" + self.config.tcp)

    def _prepare_socket_dir(self) -> None:
        directory = os.path.dirname(os.path.abspath(self.config.socket))
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--socket: cannot create directory {directory}: {exc.strerror}") from None
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ConfigError(f"--socket: directory {directory} is not writable; choose another --socket")

    def _take_lock(self) -> None:
        lock_path = self.config.socket + ".lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"another kvstore daemon is already serving on {self.config.socket}; "
                              f"stop it first or choose another --socket") from None
        self._lock_fd = fd
        if os.path.exists(self.config.socket):
            logs.warning("stale_socket_removed", path=self.config.socket)
            os.unlink(self.config.socket)

    def _bind(self, transport: str, address: str) -> None:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, -1)
        old_umask = os.umask(0o077)  # the ipc socket file is owner-only from its first moment
        try:
            sock.bind(address)
        except zmq.ZMQError as exc:
            sock.close()
            flag = "--socket" if transport == "ipc" else "--tcp"
            raise ConfigError(f"{flag}: cannot listen on {address}: {exc}") from None
        finally:
            os.umask(old_umask)
        self._sockets.append((transport, sock))

    def close(self) -> None:
        for _, sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()
        self._ctx.term()
        if self._lock_fd is not None:  # only the lock holder owns the socket file
            try:
                os.unlink(self.config.socket)
            except FileNotFoundError:
                pass
        if getattr(self, "store", None) is not None:
            self.store.host.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        receivers = [asyncio.create_task(self._receive_loop(t, s)) for t, s in self._sockets]
        sweeper = asyncio.create_task(self._sweep_loop())
        logs.info("ready", pid=os.getpid(), config=self.config.describe())
        self.on_ready()
        await stop.wait()
        logs.info("stopping", sessions=len(self.sessions), leases=len(self.store.leases))
        for task in receivers + [sweeper]:
            task.cancel()
        await asyncio.gather(*receivers, sweeper, return_exceptions=True)

    def on_ready(self) -> None:
        """Hook for readiness notification (overridden by the service manager integration)."""

    # -- requests -------------------------------------------------------------------------------------------
    async def _receive_loop(self, transport: str, sock: zmq.asyncio.Socket) -> None:
        while True:
            msg = await sock.recv_multipart(copy=False)
            reply = self.handle_message(transport, msg)
            if reply is not None:
                await sock.send_multipart(reply, copy=len(reply) == 2)

    def handle_message(self, transport: str, msg: list[Any]) -> list[Any] | None:
        """Handle one received multipart message; return the reply frames (routing id first)."""
        if len(msg) < 2:
            return None  # nothing to answer: no routing id and header
        routing_id = msg[0].bytes
        owner = transport[0].encode() + routing_id
        rid: int | None = None
        self.requests += 1
        try:
            header = decode_header(msg[1].buffer)
            rid = request_id_of(header)
            op = op_of(header)
            payload = msg[2:]
            if op is Op.HELLO:
                session, reply = hello_reply(self, owner, transport, header)
                self._add_session(session)
            else:
                session = self.sessions.get(owner)
                if session is None:
                    raise VersionError("send HELLO (protocol version and namespace) before any other request")
                reply = HANDLERS[op](self, session, header, payload)
        except RequestError as exc:
            self.errors += 1
            logs.debug("request_error", error=type(exc).__name__, msg=exc.message)
            reply = [error_reply(rid, exc)]
        except Exception as exc:  # a bug: answer, log, keep serving
            self.errors += 1
            logs.error("internal_error", error=repr(exc))
            reply = [error_reply(rid, InternalError(f"internal error: {exc!r}"))]
        return [routing_id] + reply

    def _add_session(self, session: Session) -> None:
        old = self.sessions.get(session.owner)
        if old is not None:
            self.store.drop_owner(old.owner)
        self.sessions[session.owner] = session
        logs.debug("hello", client_id=session.client_id, namespace=session.namespace, transport=session.transport)

    def count_lookup_tokens(self, session: Session, asked: int, found: int) -> None:
        self.lookup_tokens += asked * session.chunk_tokens
        self.hit_tokens += found * session.chunk_tokens

    # -- background -----------------------------------------------------------------------------------------
    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            self.sweep()

    def sweep(self) -> None:
        leases, reservations = self.store.expire()
        if leases or reservations:
            logs.info("expired", leases=leases, reservations=reservations)
        for owner, session in list(self.sessions.items()):
            if session.process_gone():
                del self.sessions[owner]
                leases, reservations = self.store.drop_owner(owner)
                logs.info("client_gone", client_id=session.client_id, pid=session.pid,
                          leases=leases, reservations=reservations)

    def stats(self) -> dict[str, Any]:
        usage = self.store.host.usage()
        counters = self.store.counters
        return {
            "version": __version__,
            "uptime_s": round(time.time() - self.started, 3),
            "tiers": {"host": {"capacity_bytes": usage.capacity_bytes, "used_bytes": usage.used_bytes,
                               "chunks": usage.chunks}},
            "chunks": self.store.committed_chunks(),
            "lookup_tokens": self.lookup_tokens,
            "hit_tokens": self.hit_tokens,
            "counters": dict(counters.__dict__),
            "leases": len(self.store.leases),
            "reservations": len(self.store.reservations),
            "sessions": len(self.sessions),
            "requests": self.requests,
            "errors": self.errors,
        }


def run_daemon(config: ServerConfig) -> int:
    """Run until SIGTERM/SIGINT. Returns the process exit code."""
    try:
        import uvloop
        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass
    daemon = Daemon(config)
    try:
        daemon.open()
        asyncio.run(daemon.serve())
    finally:
        daemon.close()
    logs.info("stopped")
    return 0
