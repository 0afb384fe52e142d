"""The daemon's one dispatcher: every request, whichever transport carried it, to its handler and back, and the
client sessions it knows.

Requests are handled one at a time on the event loop: every operation is an in-memory index update of a few
microseconds, and bytes never pass through the daemon on the ipc:// path (clients copy them straight into or out of
the arena). A handler that has to wait (disk reads, write-back back-pressure, the remote store) returns a
coroutine, which its transport runs as a task while the loop keeps serving. Once the stop begins
(``stop_new_work``), every such wait is answered ``UnavailableError`` at once, and so is every request that would
start new work (hello, lookup, reserve, put, get), while those that finish work (commit, abort, release, ...) are
still answered.

Sessions: a HELLO opens one per owner (the transport's letter and its ZeroMQ routing id, or a stream
connection); every other request needs it, and a restricted tenant's keys are mapped into its key space here, in
one place (``tenants/key_space.py``). A session ends when its connection closes, its process dies
(``drop_gone_sessions``) or, on ``tcp://``, the CURVE key sending for it changes; its leases and reservations go
with it.

Metrics: every request's time is observed per operation here; an exception becomes an error reply in one place
(``_failure_reply``).

May call the requests room (the handlers, the service, sessions), the transports' parts it is handed (the
``tcp://`` peers, the refusal log), the tenants' access and key spaces and ``local_access.may_map``. It owns no
socket and no start-up claim: the daemon (``daemon.py``) binds the sockets and hands them this dispatcher.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable

from ... import logs
from ...errors import InternalError, LimitError, RequestError, UnavailableError, VersionError
from ...metrics.latency import RequestLatency
from ...protocol.wire import Op, decode_header, error_reply, header_hints, op_of, request_id_of
from ...security.curve import ServerCurve, peer_curve_key
from ...tenants.access import Principal
from ...tenants.key_space import scope_request
from ..requests.handlers import HANDLERS, hello_reply
from ..requests.service import Service
from ..requests.session import Session
from ..transport.refusals import RefusalLog
from ..transport.tcp_peers import TcpPeers
from .local_access import may_map

# While stopping, requests that would start new work are refused; these finish work already started.
FINISHING_OPS = frozenset({Op.PING, Op.COMMIT, Op.ABORT, Op.RELEASE, Op.EXTEND, Op.DELETE, Op.CLEAR, Op.STATS})


class RequestDispatcher:
    """What the transports hand every request to (the reactors' handler, the stream's ``Dispatcher``).

    Args:
        svc: what handlers may touch (``requests/service.py``).
        latency: where each request's time is observed, per operation.
    """

    def __init__(self, svc: Service, latency: RequestLatency) -> None:
        self.svc = svc
        self.latency = latency
        self.sessions: dict[bytes, Session] = {}
        self.refusals = RefusalLog()            # requests refused for their size: logged, rate-bounded
        self.curve: ServerCurve | None = None   # CURVE on tcp:// (security/curve.py), set when the daemon binds it
        self.tcp_peers: TcpPeers | None = None  # the tcp:// sessions by connection (tcp_peers.py), likewise
        self.stopping = False                   # refuse new work (see FINISHING_OPS)
        self._stop_event = asyncio.Event()      # set at the stop: waiting requests are answered UnavailableError

    def stop_new_work(self) -> None:
        """The stop began: refuse new work from now on, and answer every request still waiting at once."""
        self.stopping = True
        self._stop_event.set()

    # -- requests -------------------------------------------------------------------------------------------
    async def _finish(self, rid: int | None, op: Op, started: float, pending: Any) -> list[Any]:
        """Await a handler that had to wait (disk reads, write-back back-pressure, the remote store)."""
        try:
            reply = await self._unless_stopping(pending)
        except Exception as exc:  # noqa: BLE001 - answered with an error reply, the daemon keeps serving
            reply = self._failure_reply(rid, exc)
        self.latency.observe(op, time.perf_counter() - started)
        return reply

    async def _unless_stopping(self, pending: Awaitable[list[Any]]) -> list[Any]:
        """``pending``'s reply, or UnavailableError as soon as the daemon starts stopping (the handler then
        finishes on its own and its reply is dropped: the client must not wait out its timeout meanwhile)."""
        if self._stop_event.is_set():
            return await pending
        work = asyncio.ensure_future(pending)
        stop = asyncio.ensure_future(self._stop_event.wait())
        await asyncio.wait((work, stop), return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            stop.cancel()
            return work.result()
        work.add_done_callback(_drop_late_reply)
        raise UnavailableError("the daemon is shutting down; retry once it is back")

    def _failure_reply(self, rid: int | None, exc: Exception) -> list[Any]:
        """The one place an exception becomes an error reply: request errors as they are, anything else as an
        InternalError (a bug: answered and logged, and the daemon keeps serving)."""
        self.svc.counters.errors += 1
        if isinstance(exc, RequestError):
            logs.debug("request_error", error=type(exc).__name__, msg=exc.message)
            return [error_reply(rid, exc)]
        logs.error("internal_error", error=repr(exc))
        return [error_reply(rid, InternalError(f"internal error: {exc!r}"))]

    def after_reply(self) -> None:
        """A reply was written: do what its request left for after it (``store/after_reply.py``)."""
        self.svc.store.puts.settle_after_reply()

    def handle_message(self, transport: str, msg: list[Any]) -> Any:
        """Handle one received ZeroMQ multipart message; return the reply frames (routing id first), or a
        coroutine returning them when the handler has to wait (it runs as a task; the loop keeps serving)."""
        if len(msg) < 2:
            return None  # nothing to answer: no routing id and header
        routing_id = msg[0].bytes
        owner = transport[0].encode() + routing_id
        principal = None
        if transport == "tcp" and self.curve is not None:
            principal = self._curve_principal(owner, msg[1])
        reply = self.handle_request(transport, owner, msg[1].buffer, msg[2:], principal,
                                    zmq_frame=msg[1] if transport == "ipc" else None)
        if self.tcp_peers is not None and transport == "tcp" and owner in self.sessions:
            self.tcp_peers.follow(owner, msg[1])   # the session ends with this connection
        if type(reply) is not list:
            return _routed(routing_id, reply)
        return [routing_id] + reply

    def handle_request(self, transport: str, owner: bytes, raw_header: Any, payload: list[Any],
                       principal: Principal | None = None, zmq_frame: Any = None) -> Any:
        """Handle one request of ``owner`` (whatever carried it: ZeroMQ or the stream socket); return the reply
        frames (header first), or a coroutine returning them. ``principal``: who sent it, when its transport
        says (a CURVE key on ``tcp://``, the stream socket's peer credentials), else unknown. ``zmq_frame``: the
        header frame of a ZeroMQ ipc message, whose peer's uid decides what a hello may map (``may_map``)."""
        rid: int | None = None
        op: Op | None = None
        self.svc.counters.requests += 1
        self.svc.store.puts.settle_after_reply()   # the last request's leftovers, if its transport did not run them
        started = time.perf_counter()
        try:
            header = decode_header(raw_header)
            rid = request_id_of(header)
            op = op_of(header)
            if self.stopping and op not in FINISHING_OPS:
                raise UnavailableError("the daemon is shutting down; retry once it is back")
            if op is Op.HELLO:
                maps = may_map(principal, transport, zmq_frame)   # local_access.py: who may map our files
                session, reply = hello_reply(self.svc, owner, transport, header, principal or Principal(), maps)
                self._add_session(session)
            else:
                known = self.sessions.get(owner)
                if known is None:
                    raise VersionError("send HELLO (protocol version and namespace) before any other request")
                # The one place keys are translated: a restricted tenant's keys into its key space.
                header = scope_request(self.svc.key_space(known), op, header)
                reply = HANDLERS[op](self.svc, known, header, payload)
                if type(reply) is not list:   # a coroutine: the handler has to wait
                    return self._finish(rid, op, started, reply)
        except Exception as exc:  # noqa: BLE001 - answered with an error reply, the daemon keeps serving
            reply = self._error_reply(transport, owner, raw_header, len(raw_header), rid, op, exc)
        if op is not None:
            self.latency.observe(op, time.perf_counter() - started)
        return reply

    def _curve_principal(self, owner: bytes, frame: Any) -> Principal:
        """The CURVE key that sent ``frame`` on ``tcp://``, read from every message (a routing id could be taken
        over by another connection after its own closed): a session whose key is not the one it said hello with
        is dropped, so its successor must say hello as itself."""
        principal = Principal(curve_key=peer_curve_key(frame))
        session = self.sessions.get(owner)
        if session is not None and session.principal != principal:
            self.drop_session(owner, "curve_key_changed")
        return principal

    def refuse_request(self, transport: str, owner: bytes, head: bytes, length: int, exc: LimitError) -> list[Any]:
        """Answer a request too long to keep (the stream read past it): ``head`` is its start, ``length`` its size."""
        self.svc.counters.requests += 1
        return self._error_reply(transport, owner, head, length, None, None, exc)

    def _error_reply(self, transport: str, owner: bytes, raw_header: Any, length: int, rid: int | None,
                     op: Op | None, exc: Exception) -> list[Any]:
        """A failed request's reply: to the id found in it if refused before it was read; size refusals logged."""
        rid, hinted = (rid, None) if rid is not None else header_hints(raw_header)
        if isinstance(exc, LimitError):
            self.refusals.note(transport, self.sessions.get(owner), op if op is not None else hinted, length, exc)
        return self._failure_reply(rid, exc)

    # -- sessions -------------------------------------------------------------------------------------------
    def _add_session(self, session: Session) -> None:
        old = self.sessions.get(session.owner)
        if old is not None:
            self.svc.store.drop_owner(old.owner)
            self.svc.engine_left(old)
        self.sessions[session.owner] = session
        logs.debug("hello", client_id=session.client_id, namespace=session.namespace, transport=session.transport)

    def drop_session(self, owner: bytes, reason: str) -> None:
        """A client is gone (its process died, or its stream closed): drop its pins now."""
        session = self.sessions.pop(owner, None)
        if session is None:
            return
        if self.tcp_peers is not None:
            self.tcp_peers.forget(owner)
        self.svc.engine_left(session)
        leases, reservations = self.svc.store.drop_owner(owner)
        if leases or reservations or reason != "connection_closed":
            logs.info("client_gone", client_id=session.client_id, pid=session.pid, reason=reason,
                      leases=leases, reservations=reservations)

    def drop_gone_sessions(self) -> None:
        """Drop the session of every local client whose process is gone (the daemon's sweep)."""
        for owner, session in list(self.sessions.items()):
            if session.process_gone():
                self.drop_session(owner, "process_gone")

    def process_alive(self, owner: bytes) -> bool:
        """Whether ``owner`` is a local client whose process the daemon follows (and which is still alive):
        its leases are not taken back at their TTL, since its views may still be read (``Daemon.sweep``)."""
        session = self.sessions.get(owner)
        return session is not None and session.pid > 0 and not session.process_gone()


async def _routed(routing_id: bytes, pending: Any) -> list[Any]:
    return [routing_id] + await pending


def _drop_late_reply(task: asyncio.Future) -> None:
    """A handler that finished after its request was answered UnavailableError at stop: log a failure only."""
    if not task.cancelled() and task.exception() is not None:
        logs.debug("late_request_failed", error=repr(task.exception()))
