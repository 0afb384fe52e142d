"""A client's session with its daemon: the hello, where requests go, and saying hello again after a restart.

Local clients say hello on ZeroMQ, learn the daemon's stream socket from the reply and send every further request
there (``protocol/stream.py``); the ZeroMQ socket stays as the fallback and for ``tcp://``. The hello also names
what the client maps (``mappings.py``): the arena, the shared index (read only while the stream to its writer is
open), the GPU pool. A request that finds the daemon restarted (a lost stream, a daemon that no longer knows us)
says hello again — mapping the new daemon's files — and is retried once. Before any request goes out, the put
queued with ``wait=False`` is settled and the lookups answered from the shared index are told (in the same
write), so that the request sees their effect.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from ..defaults import default_socket
from ..errors import DaemonUnavailable, KVStoreError, UsageError, VersionError
from ..keys import KEY_SCHEME
from ..procinfo import self_identity
from ..protocol.engine_identity import EngineIdentity
from ..protocol.stream import SUFFIX as STREAM_SUFFIX
from ..protocol.wire import PROTOCOL_VERSION, Op
from ..security.curve import ClientCurve
from . import arguments
from .credit import CreditWriter, HeldCredit
from .load_notes import LoadNotes
from .mappings import Mappings
from ..mapped.index_reader import SeenNotes
from .stream_transport import StreamTransport
from .transport import Transport
from .transport_base import ConnectionLost

DEFAULT_NAMESPACE = "default"
DEFAULT_CHUNK_TOKENS = 256


class Session(Mappings):
    """The Client's connection to one daemon (a base class: ``client.py`` adds the operations)."""

    def __init__(self, address: str | None = None, namespace: str = DEFAULT_NAMESPACE,
                 chunk_tokens: int = DEFAULT_CHUNK_TOKENS, timeout: float = 5.0,
                 client_id: str | None = None, use_arena: bool | None = None,
                 curve: ClientCurve | None = None, gpu: bool = False, pin_arena: bool = False,
                 key_scheme: str = KEY_SCHEME, hash_seed: int = 0,
                 shared_index: bool = True, stream: bool = True, credits: bool = True,
                 connector: dict[str, str] | None = None, identity: EngineIdentity | None = None) -> None:
        """Connect to the daemon at ``address`` (``ipc:///path`` or ``tcp://host:port``; None: the default
        socket of ``kvstore serve``) for the chunks of ``namespace``, each of ``chunk_tokens`` tokens.
        ``timeout``: seconds to wait for each reply. Raises UsageError for a bad argument, DaemonUnavailable when
        no daemon answers, and the daemon's refusal (VersionError, IncompatibleError, ...) as it is."""
        self.address = address or "ipc://" + default_socket()
        if not isinstance(self.address, str) or not self.address.startswith(("ipc://", "tcp://")):
            hint = f" (a socket path? use ipc://{self.address})" if str(self.address).startswith("/") else ""
            raise UsageError(f"address must start with ipc:// or tcp://, got {self.address!r}{hint}")
        arguments.positive_int("connect", "chunk_tokens", chunk_tokens)
        self.namespace = arguments.text("connect", "namespace", namespace)
        self.chunk_tokens = chunk_tokens
        self.timeout = arguments.positive_seconds("connect", "timeout", timeout)
        self.client_id = client_id or f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # How this client's keys are made: a daemon holding chunks of the namespace made otherwise refuses it.
        self.key_scheme, self.hash_seed = key_scheme, hash_seed
        self.use_arena = self.address.startswith("ipc://") if use_arena is None else use_arena
        self._zmq = Transport(self.address, self.timeout, curve)
        self._transport: Transport | StreamTransport = self._zmq   # where requests go: the stream when there is one
        # Local clients send their requests on the daemon's stream socket (protocol/stream.py) when it has one;
        # one that does not map the arena (use_arena=False, or another user's) carries its bytes on it too.
        self.want_stream = stream and self.address.startswith("ipc://")
        self._no_mappings()
        self.want_gpu = gpu and self.use_arena
        # Page-lock our arena mappings (CUDA) so that copies between leased views and the GPU are asynchronous
        # DMA; implied by gpu=True when the daemon has a GPU tier, useful alone for engines without one.
        self.pin_arena = pin_arena
        self.server_info: dict[str, Any] = {}
        # An engine connector's report of itself ({"engine", "family", "state": "on"|"off", "reason"}),
        # shown by `kvstore stats` and counted on /metrics while this client is connected.
        self.connector = connector
        # The engine instance this client serves (its router's name for it, model, data-parallel rank): the daemon
        # publishes KV cache events of this namespace on that engine's topic while the client is connected.
        if identity is not None and not isinstance(identity, EngineIdentity):
            raise UsageError(f"identity must be a kvstore.protocol.engine_identity.EngineIdentity, "
                             f"got {type(identity).__name__}")
        self.identity = identity
        # Lookups from the daemon's shared-memory index (local clients; shared_index=False always asks the socket)
        self.want_shared_index = shared_index and self.use_arena
        self._seen = SeenNotes()
        self._loads = LoadNotes()   # the connector's own loads, timed (note_load)
        self._credit = CreditWriter(credits)   # puts in one round trip (client/credit.py); False: reserve + commit
        try:
            self._hello()
        except BaseException:
            self.close()   # no socket or mapping outlives a failed connect
            raise

    def _hello(self) -> None:
        pid, pid_start = self_identity()
        hello = {
            "op": Op.HELLO, "version": PROTOCOL_VERSION, "namespace": self.namespace,
            "client_id": self.client_id, "chunk_tokens": self.chunk_tokens,
            "pid": pid, "pid_start": pid_start, "arena": self.use_arena, "gpu": self.want_gpu,
            "key_scheme": self.key_scheme, "hash_seed": self.hash_seed,
            **({"connector": self.connector} if self.connector else {}),
            **({"identity": self.identity.wire()} if self.identity is not None else {}),
        }
        self._credit.forget()   # a new session holds no credit
        header = self._hello_on_stream(hello)
        if header is None:
            self._transport = self._zmq
            header, _ = self._zmq.call(hello)
        self.server_info = header
        self._attach_arena(header.get("arena"))
        # The index is read only while our stream to its writer is open: a daemon that died shows there at once
        on_stream = isinstance(self._transport, StreamTransport)
        self._attach_index(header.get("index") if self.want_shared_index and on_stream else None)
        self._attach_gpu(header.get("gpu") if self._arena is not None else None)
        if self.pin_arena:
            self._page_lock_arena()

    def _hello_on_stream(self, hello: dict[str, Any]) -> dict[str, Any] | None:
        """Say hello on the daemon's stream socket and send everything there from now on; None when there is
        none to use (not a local client, no such socket, or it refused us): ZeroMQ then carries the requests."""
        if self._transport is not self._zmq:
            self._transport.close()
            self._transport = self._zmq
            self._detach_index()   # read only while on a stream (see _hello)
        if not self.want_stream:
            return None
        try:
            stream = StreamTransport(self.address[len("ipc://"):] + STREAM_SUFFIX, self.timeout)
        except OSError:
            return None
        try:
            header, _ = stream.call(hello)
        except KVStoreError:
            stream.close()
            return None
        self._transport = stream
        return header

    def _call(self, header: dict[str, Any], payloads: list[Any] | None = None,
              retry: bool = True) -> tuple[dict[str, Any], list[Any]]:
        if self._credit.queued is not None:
            self._credit.settle(self)   # first, so that this request sees the queued put's chunks
        if self._seen:
            self._send_seen(hold=True)   # first (in the same write), so that this request sees their effect
        try:
            return self._transport.call(header, payloads)
        except ConnectionLost as exc:
            self._hello()  # the daemon restarted or dropped us (or stopped: DaemonUnavailable from here)
            if not retry:  # as when the request reaches a daemon that no longer knows us
                raise VersionError(f"the session ended before this request was answered ({exc})") from exc
        except VersionError:
            if not retry:
                raise
            self._hello()  # the daemon restarted and forgot us
        return self._transport.call(header, payloads)

    def _send(self, header: dict[str, Any]) -> int:
        """Send one request of a pipelined batch without waiting; ``_reply`` collects its answer. A daemon that
        restarted meanwhile raises VersionError (after a new hello): the batch's other replies are gone."""
        if self._seen:
            self._send_seen(hold=True)
        try:
            return self._transport.send(header)
        except ConnectionLost as exc:
            self._hello()
            raise VersionError(f"the session ended before this request was answered ({exc})") from exc

    def _reply(self, rid: int) -> dict[str, Any]:
        try:
            return self._transport.wait(rid)[0]
        except ConnectionLost as exc:
            self._hello()
            raise VersionError(f"the session ended before this request was answered ({exc})") from exc

    # The session's interface to the client's helpers (``port.py``).

    @property
    def transport(self) -> Transport | StreamTransport:
        """Where requests go now (the stream socket, else ZeroMQ)."""
        return self._transport

    def request(self, header: dict[str, Any], payloads: list[Any] | None = None,
                retry: bool = True) -> tuple[dict[str, Any], list[Any]]:
        """One request and its reply (``_call``)."""
        return self._call(header, payloads, retry)

    def send_request(self, header: dict[str, Any]) -> int:
        """One request of a pipelined batch, not waited for (``_send``)."""
        return self._send(header)

    def wait_reply(self, rid: int) -> dict[str, Any]:
        """The reply header to ``rid`` (``_reply``)."""
        return self._reply(rid)

    @property
    def held_credit(self) -> HeldCredit | None:
        """The put credit this client holds now (``credit.py``: its id, offset and size in the arena), or None."""
        return self._credit.held

    def _send_seen(self, hold: bool = False) -> None:
        """Tell the daemon about the lookups answered from the shared index (no reply awaited; dropped when the
        daemon is not there, like the lookups' effect on a daemon that restarted). ``hold``: a request follows
        at once, and the note goes out in the same write."""
        note = self._seen.take()
        if note is None:
            return
        try:
            self._transport.send({"op": Op.LOOKUP_SEEN, **note}, timeout=0, want_reply=False, hold=hold)
        except DaemonUnavailable:
            pass

    def note_load(self, medium: str, nbytes: int, seconds: float) -> None:
        """Tell the daemon that loading ``nbytes`` from ``medium`` took ``seconds``, from asking for the chunks to
        the end of their copy into the engine: the daemon publishes what a KiB costs per medium for routers
        (``load_ns_per_kib`` in stats). ``medium``: "CPU" (the shared arena) or "GPU" (the GPU pool). Summed here
        and sent without waiting for a reply, at most once a second. Raises UsageError for another medium or a
        negative size or time."""
        if self._loads.add(medium, nbytes, seconds):
            note = self._loads.take()
            if note is not None:
                try:
                    self._transport.send({"op": Op.LOAD_TIMES, **note}, timeout=0, want_reply=False)
                except DaemonUnavailable:
                    pass   # like a lookup's note: lost with a daemon that is not there

    def close(self) -> None:
        """Publish a queued put, tell the daemon the last lookups, and close the sockets and mappings. Idempotent;
        every later call raises ClientClosedError."""
        self._credit.settle(self)   # a queued put is published before the stream closes (call flush for errors)
        note = self._seen.take()
        if note is not None or self._transport.holding:
            try:   # awaited: closing the socket would drop a note still queued (or held) in it
                self._transport.call({"op": Op.LOOKUP_SEEN, **(note or {"asked": [], "found": []})}, timeout=1.0)
            except KVStoreError:
                pass
        if self._transport is not self._zmq:
            self._transport.close()
            self._transport = self._zmq   # closed below: every later call raises ClientClosedError
        self._zmq.close()
        self._detach_index()
        self._detach_arena()
