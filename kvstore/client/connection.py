"""A client's connection to one daemon: the sockets, the hello, and the one path every request takes.

Local clients say hello on ZeroMQ, learn the daemon's stream socket from the reply and send every further request
there (``protocol/stream.py``); the ZeroMQ socket stays as the fallback and for ``tcp://``. The hello also names
what the client maps (``mappings.py``): the arena, the shared index (read only while the stream to its writer is
open), the GPU pool. A request that finds the daemon restarted (a lost stream, a daemon that no longer knows us)
says hello again — mapping the new daemon's files — and is retried once. Before any request goes out, the put
queued with ``wait=False`` is settled and the lookups answered from the shared index are told (in the same
write), so that the request sees their effect.

Owns: both transports and which one requests go on, the hello (``settings.py`` makes it) and ``server_info``,
the mappings, the put credit (``credit.py``: it lives as long as the daemon's session, so every hello forgets
it), and the notes sent without a reply (lookups answered from the index, load times). Two request paths:
``request`` settles the queued put first (every caller but the credit writer), ``call`` does not (the credit
writer, which settles it itself). May call: the transports, the mappings, the credit writer; nothing of
``client.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import DaemonUnavailable, KVStoreError, VersionError
from ..protocol.stream import SUFFIX as STREAM_SUFFIX
from ..protocol.wire import Op
from ..security.curve import ClientCurve
from .credit import CreditWriter
from .load_notes import LoadNotes
from .mappings import Mappings
from ..mapped.index_reader import SeenNotes
from .settings import ClientSettings
from .stream_transport import StreamTransport
from .transport import Transport
from .transport_base import ConnectionLost

if TYPE_CHECKING:
    from .port import ConnectionPort


class Connection:
    """One client's session with one daemon, said again after a restart (``Client`` has one)."""

    def __init__(self, settings: ClientSettings, curve: ClientCurve | None = None, credits: bool = True) -> None:
        """Open the sockets and say hello; see ``Client`` for the arguments.

        Raises:
            UsageError: the address is not one ZeroMQ can connect to.
            DaemonUnavailable: no daemon answers.
            KVStoreError: the daemon's refusal of the hello (VersionError, IncompatibleError, ...) as it is.
        """
        self.settings = settings
        self.server_info: dict[str, Any] = {}   # the daemon's reply to the last hello
        self.mapped = Mappings(settings.namespace)
        self.seen = SeenNotes()         # lookups answered from the shared index, not yet told
        self.loads = LoadNotes()        # the connector's own loads, timed (note_load)
        self.credit = CreditWriter(self, credits)   # puts in one round trip; False: reserve + commit
        self._zmq = Transport(settings.address, settings.timeout, curve)
        self._transport: Transport | StreamTransport = self._zmq   # where requests go: the stream when there is one
        try:
            self.hello()
        except BaseException:
            self.close()   # no socket or mapping outlives a failed connect
            raise

    def hello(self) -> None:
        """Say hello (again: after a daemon restart), on the stream socket where there is one, and map what the
        reply names. Raises what the request raises (DaemonUnavailable, the daemon's refusal)."""
        hello = self.settings.hello()
        self.credit.forget()   # a new session holds no credit
        header = self._hello_on_stream(hello)
        if header is None:
            self._transport = self._zmq
            header, _ = self._zmq.call(hello)
        self.server_info = header
        self.mapped.attach_arena(header.get("arena"))
        # The index is read only while our stream to its writer is open: a daemon that died shows there at once
        on_stream = isinstance(self._transport, StreamTransport)
        self.mapped.attach_index(header.get("index") if self.settings.want_shared_index and on_stream else None)
        self.mapped.attach_gpu(header.get("gpu") if self.mapped.arena is not None else None)
        if self.settings.pin_arena:
            self.mapped.page_lock_arena()

    def _hello_on_stream(self, hello: dict[str, Any]) -> dict[str, Any] | None:
        """Say hello on the daemon's stream socket and send everything there from now on; None when there is
        none to use (not a local client, no such socket, or it refused us): ZeroMQ then carries the requests."""
        if self._transport is not self._zmq:
            self._transport.close()
            self._transport = self._zmq
            self.mapped.detach_index()   # read only while on a stream (see hello)
        if not self.settings.want_stream:
            return None
        try:
            stream = StreamTransport(self.settings.address[len("ipc://"):] + STREAM_SUFFIX, self.settings.timeout)
        except OSError:
            return None
        try:
            header, _ = stream.call(hello)
        except KVStoreError:
            stream.close()
            return None
        self._transport = stream
        return header

    # -- the request path ------------------------------------------------------------------------------------

    def request(self, header: dict[str, Any], payloads: list[Any] | None = None,
                retry: bool = True) -> tuple[dict[str, Any], list[Any]]:
        """One request and its reply, once the put queued with ``wait=False`` is settled (so that the request sees
        its chunks); see ``call``."""
        self.credit.settle()
        return self.call(header, payloads, retry)

    def call(self, header: dict[str, Any], payloads: list[Any] | None = None,
             retry: bool = True) -> tuple[dict[str, Any], list[Any]]:
        """One request and its reply, the lookups answered from the shared index told first (in the same write).

        Args:
            header: the request's fields (``op`` and its arguments; the transport adds the id).
            payloads: buffers sent after the header (an inline put's chunks).
            retry: after a daemon restart (a lost connection, a daemon that no longer knows us), say hello again
                and send the request once more; False: say hello again and raise VersionError (for requests
                whose effect may or may not have happened: a commit, a credit put).

        Returns:
            The reply's header and payloads.

        Raises:
            KVStoreError: the error the daemon replied (its class per code), DaemonUnavailable when it does not
                answer, ClientClosedError after ``close``.
        """
        if self.seen:
            self.tell_seen(hold=True)   # first (in the same write), so that this request sees their effect
        try:
            return self._transport.call(header, payloads)
        except ConnectionLost as exc:
            self.hello()   # the daemon restarted or dropped us (or stopped: DaemonUnavailable from here)
            if not retry:  # as when the request reaches a daemon that no longer knows us
                raise VersionError(f"the session ended before this request was answered ({exc})") from exc
        except VersionError:
            if not retry:
                raise
            self.hello()   # the daemon restarted and forgot us
        return self._transport.call(header, payloads)

    def send(self, header: dict[str, Any]) -> int:
        """Send one request of a pipelined batch without waiting; ``reply`` collects its answer. A daemon that
        restarted meanwhile raises VersionError (after a new hello): the batch's other replies are gone."""
        if self.seen:
            self.tell_seen(hold=True)
        try:
            return self._transport.send(header)
        except ConnectionLost as exc:
            self.hello()
            raise VersionError(f"the session ended before this request was answered ({exc})") from exc

    def reply(self, rid: int) -> dict[str, Any]:
        """The reply header to ``rid`` (sent by ``send``); raises as ``send`` does, and the daemon's error."""
        try:
            return self._transport.wait(rid)[0]
        except ConnectionLost as exc:
            self.hello()
            raise VersionError(f"the session ended before this request was answered ({exc})") from exc

    @property
    def transport(self) -> Transport | StreamTransport:
        """Where requests go now (the stream socket, else ZeroMQ)."""
        return self._transport

    # -- notes sent without a reply --------------------------------------------------------------------------

    def tell_seen(self, hold: bool = False) -> None:
        """Tell the daemon about the lookups answered from the shared index (no reply awaited; dropped when the
        daemon is not there, like the lookups' effect on a daemon that restarted). ``hold``: a request follows
        at once, and the note goes out in the same write."""
        note = self.seen.take()
        if note is None:
            return
        try:
            self._transport.send({"op": Op.LOOKUP_SEEN, **note}, timeout=0, want_reply=False, hold=hold)
        except DaemonUnavailable:
            pass

    def note_load(self, medium: str, nbytes: int, seconds: float) -> None:
        """Count one load (``Client.note_load``) and send the sums when a note is due, without waiting for a
        reply. Raises UsageError for another medium or a negative size or time."""
        if self.loads.add(medium, nbytes, seconds):
            note = self.loads.take()
            if note is not None:
                try:
                    self._transport.send({"op": Op.LOAD_TIMES, **note}, timeout=0, want_reply=False)
                except DaemonUnavailable:
                    pass   # like a lookup's note: lost with a daemon that is not there

    def close(self) -> None:
        """Publish a queued put, tell the daemon the last lookups, and close the sockets and mappings. Idempotent;
        every later request raises ClientClosedError."""
        self.credit.settle(wait=True)   # a queued put is published before the stream closes (flush for errors)
        note = self.seen.take()
        if note is not None or self._transport.holding:
            try:   # awaited: closing the socket would drop a note still queued (or held) in it
                self._transport.call({"op": Op.LOOKUP_SEEN, **(note or {"asked": [], "found": []})}, timeout=1.0)
            except KVStoreError:
                pass
        if self._transport is not self._zmq:
            self._transport.close()
            self._transport = self._zmq   # closed below: every later call raises ClientClosedError
        self._zmq.close()
        self.mapped.detach_index()
        self.mapped.detach_arena()


if TYPE_CHECKING:
    def _implements_connection_port(conn: Connection) -> ConnectionPort:
        return conn   # the type checker proves that a Connection is the port its credit writer, leases and verify use
