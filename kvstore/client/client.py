"""The client: the public surface engines and tools use to talk to a kvstore daemon.

Over ``ipc://`` the client maps the daemon's shared arena: ``put`` copies each buffer with one memcpy into the
arena space the daemon lent it and commits in one message (``credit.py``; reserve → copy → commit when it lends
none); ``get`` takes a lease and returns zero-copy views of the leased slots. Over
``tcp://`` the same calls carry the bytes in ZeroMQ frames. If the daemon restarts, the client says hello
again (re-mapping the new arena) and retries the request once. ``get_into`` copies chunks into the caller's
buffers, for a local client straight out of the arena without a round trip (``arena_read.py``); ``put(...,
wait=False)`` returns once the bytes are in place and the commit is sent (``credit.py``; ``flush`` reports).

Around this file: ``lease.py`` (what get and reserve hand back), ``mappings.py`` (the arena, index and GPU pool
mapped at hello), ``credit.py`` (put credits), ``shared_index.py`` (lookups from shared memory), ``copies.py``
(large batches copied by two threads), the transports.

``gpu=True`` (engines on the daemon's GPU): the client asks for the GPU tier's pool at hello, maps it once
(``kvstore.gpu.engine.MappedPool``) and page-locks its own mapping of the arena; ``get`` then returns a
``uint8`` tensor view of the pool for every chunk the GPU tier holds, and memoryviews for the others. Only such
clients import torch. Without the mapping (no GPU tier, another GPU, CUDA IPC refused) everything is read from
DRAM as usual: the daemon copies GPU-only chunks down for readers that do not map the pool.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from typing import Any, Callable, Sequence

from ..config import default_socket
from ..errors import ClientClosedError, DaemonUnavailable, KVStoreError, UsageError, VersionError
from ..keys import KEY_SCHEME
from ..keys import chunk_keys as _chunk_keys
from ..procinfo import self_identity
from ..protocol.messages import check_batch, wire_keys
from ..protocol.stream import SUFFIX as STREAM_SUFFIX
from ..protocol.wire import PROTOCOL_VERSION, Op
from ..security.curve import ClientCurve
from .arena_read import read_into, read_with
from .buffers import copy_into, copy_out, nbytes_of, writable_bytes
from .copies import copy_batch
from .credit import CreditWriter
from .lease import Lease, LookupResult, Reservation
from .mappings import Mappings
from .shared_index import SeenNotes, tiers_of
from .stream_transport import StreamLost, StreamTransport
from .transport import Transport

__all__ = ["Client", "Lease", "LookupResult", "Reservation", "connect"]

DEFAULT_NAMESPACE = "default"
DEFAULT_CHUNK_TOKENS = 256


class Client(Mappings):
    """A connection to one daemon. Not fork-safe; use one per thread for the best concurrency."""

    def __init__(self, address: str | None = None, namespace: str = DEFAULT_NAMESPACE,
                 chunk_tokens: int = DEFAULT_CHUNK_TOKENS, timeout: float = 5.0,
                 client_id: str | None = None, use_arena: bool | None = None,
                 curve: ClientCurve | None = None, gpu: bool = False, pin_arena: bool = False,
                 key_scheme: str = KEY_SCHEME, hash_seed: int = 0,
                 shared_index: bool = True, stream: bool = True, credits: bool = True,
                 connector: dict[str, str] | None = None) -> None:
        self.address = address or "ipc://" + default_socket()
        if not self.address.startswith(("ipc://", "tcp://")):
            hint = f" (a socket path? use ipc://{self.address})" if self.address.startswith("/") else ""
            raise UsageError(f"address must start with ipc:// or tcp://, got {self.address!r}{hint}")
        if chunk_tokens <= 0:
            raise UsageError(f"chunk_tokens must be positive, got {chunk_tokens}")
        self.namespace = namespace
        self.chunk_tokens = chunk_tokens
        self.client_id = client_id or f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # How this client's keys are made: a daemon holding chunks of the namespace made otherwise refuses it.
        self.key_scheme, self.hash_seed = key_scheme, hash_seed
        self.use_arena = self.address.startswith("ipc://") if use_arena is None else use_arena
        self._zmq = Transport(self.address, timeout, curve)
        self._transport: Transport | StreamTransport = self._zmq   # where requests go: the stream when there is one
        # Local clients send their requests on the daemon's stream socket (protocol/stream.py) when it has one
        self.want_stream = stream and self.use_arena and self.address.startswith("ipc://")
        self.timeout = timeout
        self._no_mappings()
        self.want_gpu = gpu and self.use_arena
        # Page-lock our arena mapping (CUDA) so that copies from leased views to the GPU are asynchronous DMA;
        # implied by gpu=True when the daemon has a GPU tier, useful alone for engines without one.
        self.pin_arena = pin_arena
        self.server_info: dict[str, Any] = {}
        # An engine connector's report of itself ({"engine", "family", "state": "on"|"off", "reason"}),
        # shown by `kvstore stats` and counted on /metrics while this client is connected.
        self.connector = connector
        # Lookups from the daemon's shared-memory index (local clients; shared_index=False always asks the socket)
        self.want_shared_index = shared_index and self.use_arena
        self._seen = SeenNotes()
        self._credit = CreditWriter(credits)   # puts in one round trip (client/credit.py); False: reserve + commit
        try:
            self._hello()
        except BaseException:
            self.close()   # no socket or mapping outlives a failed connect
            raise

    # -- session --------------------------------------------------------------------------------------------
    def _hello(self) -> None:
        pid, pid_start = self_identity()
        hello = {
            "op": Op.HELLO, "version": PROTOCOL_VERSION, "namespace": self.namespace,
            "client_id": self.client_id, "chunk_tokens": self.chunk_tokens,
            "pid": pid, "pid_start": pid_start, "arena": self.use_arena, "gpu": self.want_gpu,
            "key_scheme": self.key_scheme, "hash_seed": self.hash_seed,
            **({"connector": self.connector} if self.connector else {}),
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
        if self.pin_arena and self._page_locked is None and self._arena is not None:
            from ..gpu.engine import page_lock_mapping  # torch: only for clients that ask for page-locking

            self._page_locked = page_lock_mapping(self._arena.buf, self._arena.size)

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
        except StreamLost as exc:
            self._hello()  # the daemon restarted (or stopped: DaemonUnavailable from here)
            if not retry:  # as on ZeroMQ, where the request would have reached a daemon that never met us
                raise VersionError(f"the daemon restarted before this request reached it ({exc})") from exc
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
        except StreamLost as exc:
            self._hello()
            raise VersionError(f"the daemon restarted before this request reached it ({exc})") from exc

    def _reply(self, rid: int) -> dict[str, Any]:
        try:
            return self._transport.wait(rid)[0]
        except StreamLost as exc:
            self._hello()
            raise VersionError(f"the daemon restarted before it answered ({exc})") from exc

    # -- keys -----------------------------------------------------------------------------------------------
    def chunk_keys(self, token_ids: Sequence[int] | Any, include_partial: bool = False,
                   namespace: str | None = None, chunk_tokens: int | None = None) -> list[bytes]:
        """One chained key per full chunk of ``token_ids`` (and the short tail if ``include_partial``).

        ``namespace`` and ``chunk_tokens`` default to the client's; a connector serving several models through
        one client passes each model's own.
        """
        return _chunk_keys(namespace or self.namespace, token_ids, chunk_tokens or self.chunk_tokens,
                           include_partial)

    # -- operations ------------------------------------------------------------------------------------------
    def ping(self) -> None:
        self._call({"op": Op.PING})

    def lookup(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` are stored (in any tier). Pins nothing."""
        check_batch(keys, "lookup")
        local = self._lookup_local(keys, True) if keys else None
        return local[0] if local is not None else self.lookup_tiers(keys).count

    def lookup_many(self, chains: Sequence[Sequence[bytes]]) -> list[int]:
        """``lookup`` of several key chains: from the shared index where it answers, else in one round trip
        (the requests are pipelined)."""
        for keys in chains:
            check_batch(keys, "lookup_many")
        if self._index is not None and self._transport.alive():
            return [self.lookup(keys) for keys in chains]
        try:
            return self._lookup_many(chains)
        except (VersionError, StreamLost):
            self._hello()  # the daemon restarted and forgot us
            return self._lookup_many(chains)

    def _lookup_many(self, chains: Sequence[Sequence[bytes]]) -> list[int]:
        if self._credit.queued is not None:
            self._credit.settle(self)
        if self._seen:
            self._send_seen(hold=True)
        ids = [self._transport.send({"op": Op.LOOKUP, "keys": wire_keys(keys), "promote": True}) if keys else 0
               for keys in chains]
        counts, error = [], None
        for rid in ids:  # every reply is waited for (or given up on), so none is left behind when one fails
            try:
                wait = 0.0 if isinstance(error, DaemonUnavailable) else None
                counts.append(int(self._transport.wait(rid, wait)[0]["count"]) if rid else 0)
            except Exception as exc:  # noqa: BLE001 - re-raised below, once the others are in
                error = error or exc
                counts.append(0)
        if error is not None:
            raise error
        return counts

    def lookup_tiers(self, keys: Sequence[bytes], promote: bool = True) -> LookupResult:
        """How many leading ``keys`` are stored and how many of those each tier holds. Read from the daemon's
        shared index where it can answer (``client/shared_index.py``), else asked over the socket."""
        check_batch(keys, "lookup_tiers")
        if not keys:
            return LookupResult(0, {})
        local = self._lookup_local(keys, promote)
        if local is not None:
            return LookupResult(local[0], tiers_of(local[1]))
        header, _ = self._call({"op": Op.LOOKUP, "keys": wire_keys(keys), "promote": promote})
        return LookupResult(int(header["count"]), dict(header.get("tiers", {})))

    def _lookup_local(self, keys: Sequence[bytes], promote: bool) -> tuple[int, list[int], bytes] | None:
        """The shared index's answer (leading keys stored, count per state, those keys packed), or None: ask the
        socket."""
        if self._credit.queued is not None:
            self._credit.settle(self)   # a lookup sees this client's queued puts
        if self._index is None or not self._transport.alive():
            return None
        answer = self._index.answer(keys, promote)
        if answer is not None and self._seen.add_packed(len(keys), answer[2]):
            self._send_seen()   # now: what watches the daemon sees a lookup even if this client idles
        return answer

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

    def put(self, keys: Sequence[bytes], buffers: Sequence[Any], parent: bytes | None = None,
            wait: bool = True) -> int | None:
        """Store one buffer (bytes-like or tensor) per key; keys already stored are skipped.

        ``parent`` is the key that precedes ``keys[0]`` in its chain, if any. Returns how many chunks were
        written. Raises StoreFullError when the daemon cannot make room.

        ``wait=False`` (a local client): return None once the bytes are in the arena and the commit is sent,
        without waiting for the daemon to publish them; ``flush`` returns how many chunks such puts wrote and
        raises the first error one met (so does the next ``put``). Any read or request of this client waits for
        the queued commit first, so it sees the chunks.
        """
        if len(keys) != len(buffers):
            raise UsageError(f"put: {len(keys)} keys but {len(buffers)} buffers")
        check_batch(keys, "put")
        if not wait and self._credit.error is not None:
            self.flush()   # raises the queued puts' error
        if not keys:
            return 0 if wait else None
        if self._arena_view is None:
            return self._not_waited(self._put_inline(keys, buffers, parent), wait)
        sizes = [nbytes_of(b) for b in buffers]
        committed = self._credit.put(self, keys, buffers, sizes, parent, wait)
        if committed is not None:
            return committed if wait else None
        return self._not_waited(self._put_reserved(keys, buffers, sizes, parent), wait)

    def flush(self) -> int:
        """Wait for the puts sent with ``wait=False``: how many chunks they wrote since the last flush; raises
        the first error one of them met."""
        self._credit.settle(self)
        return self._credit.take_result()

    def _not_waited(self, committed: int, wait: bool) -> int | None:
        """A put that could not be queued was made at once: ``flush`` counts it with the queued ones."""
        if wait:
            return committed
        self._credit.committed += committed
        return None

    def _put_reserved(self, keys: Sequence[bytes], buffers: Sequence[Any], sizes: list[int],
                      parent: bytes | None) -> int:
        reservation = self.reserve(keys, sizes, parent)
        try:
            todo = [(view, buf) for view, buf in zip(reservation.views, buffers) if view is not None]
            copy_batch(copy_into, todo, [view.nbytes for view, _ in todo])
        except BaseException:
            reservation.abort()
            raise
        return reservation.commit()

    def reserve(self, keys: Sequence[bytes], sizes: Sequence[int], parent: bytes | None = None) -> Reservation:
        """Reserve arena slots of ``sizes`` bytes for ``keys`` (ipc:// only); see ``Reservation``."""
        if self._arena_view is None:
            raise ValueError("reserve needs the shared arena (an ipc:// client); use put over tcp://")
        check_batch(keys, "reserve")
        offered = self._credit.offer(self)   # the space lent to us may be what is missing: the daemon frees it then
        request = {"op": Op.RESERVE, "keys": wire_keys(keys), "sizes": list(sizes), "parent": parent,
                   "credit": offered.id if offered else 0}
        header = None
        try:
            header, _ = self._call(request)
        finally:
            self._credit.offer_done(self, offered, header)
        views: list[memoryview | None] = []
        for slot in header["slots"]:
            if slot is not None and self._pages is not None:
                self._pages.touch(slot[0], slot[1])
            views.append(None if slot is None else self._arena_view[slot[0]:slot[0] + slot[1]])
        return Reservation(self, int(header["reservation"]), views)

    def _put_inline(self, keys: Sequence[bytes], buffers: Sequence[Any], parent: bytes | None) -> int:
        from .buffers import as_host_bytes
        payloads = [as_host_bytes(b) for b in buffers]
        header, _ = self._call({"op": Op.PUT_INLINE, "keys": list(keys), "parent": parent}, payloads)
        return int(header["committed"])

    def get(self, keys: Sequence[bytes], verify: bool = False) -> Lease:
        """Lease the longest stored prefix of ``keys``; ``len(lease.views) <= len(keys)``.

        Use as ``with client.get(keys) as views:``. Over ipc:// the views are zero-copy windows on the shared
        arena, valid until the lease is released; over tcp:// they are the received frames. ``verify``: check
        every view against the chunk's checksum and hand out only the leading run that matches (see
        ``client/verify.py``); a chunk that fails is a miss, reported to the daemon.
        """
        check_batch(keys, "get")
        if not keys:
            return Lease(self, 0, [])
        sent = time.monotonic()
        header, payload = self._call({"op": Op.GET, "keys": wire_keys(keys), "inline": self._arena_view is None,
                                      "gpu": self._gpu_pool is not None and not verify, "verify": verify})
        slots = header["slots"]
        if self._arena_view is None:
            lease = Lease(self, 0, [frame.buffer for frame in payload])
        else:
            tiers = header.get("tiers") or ["host"] * len(slots)
            for (off, size), tier in zip(slots, tiers):
                if tier != "gpu" or self._gpu_pool is None:
                    self._pages.touch(off, size)
            views = [self._gpu_pool.view(off, size) if tier == "gpu" and self._gpu_pool is not None
                     else self._arena_view[off:off + size] for (off, size), tier in zip(slots, tiers)]
            lease = Lease(self, int(header["lease"]), views, list(tiers),
                          sent + float(header.get("ttl", math.inf)))
        if not verify:
            return lease
        from .verify import verified_lease

        return verified_lease(self, lease, list(keys), header.get("sums", []))

    def get_into(self, keys: Sequence[bytes], dests: Sequence[Any], verify: bool = False) -> int:
        """Copy the longest stored prefix of ``keys`` into ``dests`` (one writable buffer or tensor per key, at
        least its chunk's size; the chunk fills its leading bytes); returns how many chunks were copied.

        A local client copies straight out of the arena without a round trip where the daemon's index can answer
        (``client/arena_read.py``); otherwise — and with ``verify`` — it is a leased ``get`` and a copy."""
        if len(keys) != len(dests):
            raise UsageError(f"get_into: {len(keys)} keys but {len(dests)} destinations")
        check_batch(keys, "get_into")
        if not keys:
            return 0
        if self._credit.queued is not None:
            self._credit.settle(self)   # a read sees this client's queued puts
        copied = None if verify else self._from_arena(read_into, keys, dests)
        if copied is not None:
            return copied
        with self.get(keys, verify=verify) as views:
            pairs, sizes = [], []
            for i, (view, dest) in enumerate(zip(views, dests)):
                out = writable_bytes(dest)
                if nbytes_of(out) < nbytes_of(view):
                    raise UsageError(f"get_into: destination {i} holds {nbytes_of(out)} bytes; its chunk has "
                                     f"{nbytes_of(view)}")
                pairs.append((out, view if isinstance(view, memoryview) else memoryview(view.cpu().numpy())))
                sizes.append(pairs[-1][1].nbytes)
            copy_batch(copy_out, pairs, sizes)
            return len(views)

    def read(self, keys: Sequence[bytes], copy: Callable[[list[Any]], None]) -> int:
        """Call ``copy(views)`` with the chunks of the longest stored prefix of ``keys``, for a reader that lays
        them out its own way (an engine's cache with another order of axes); returns how many chunks it was given.

        The views (``memoryview``s of the arena, or of received frames over tcp://) are valid only during the call.
        A local client reads them straight from the arena without a round trip where the daemon's index can answer,
        and checks afterwards that none changed under the call (``client/arena_read.py``); when one did, ``copy`` is
        called again with what is there now, so it must write only into buffers of its own and redo its whole copy
        each time. Otherwise the chunks are leased for the call."""
        check_batch(keys, "read")
        if not keys:
            return 0
        if self._credit.queued is not None:
            self._credit.settle(self)   # a read sees this client's queued puts
        given = self._from_arena(read_with, keys, copy)
        if given is not None:
            return given
        with self.get(keys) as views:
            copy(list(views))
            return len(views)

    def _from_arena(self, read: Callable[..., list[bytes] | None], keys: Sequence[bytes], target: Any) -> int | None:
        """A read straight from the arena through the daemon's index (``arena_read.py``: ``read_into`` or
        ``read_with``, into ``target``), told to the daemon in the next note; the chunks read, or None: lease them."""
        if self._index is None or self._arena_view is None or not self._transport.alive():
            return None
        read_keys = read(self._index, self._arena_view, self._pages, keys, target)
        if read_keys is None:
            return None
        if read_keys and self._seen.add_read(read_keys):
            self._send_seen()
        return len(read_keys)

    def scrub(self, rate: int = 0, timeout: float = 3600.0) -> dict[str, Any]:
        """Have the daemon check every copy of every chunk now (at most ``rate`` bytes/s, 0: no bound); its
        counts per tier. Waits up to ``timeout`` seconds."""
        header, _ = self._transport.call({"op": Op.SCRUB, "rate": rate}, timeout=timeout)
        return header["scrub"]

    def report_verify(self, namespace: str, keys: Sequence[bytes], checks: int, mismatches: int,
                      max_difference: float, first_bad: int | None = None) -> int:
        """Tell the daemon how computed KV compared with its chunks ``keys``; a mismatch makes it drop the chain
        from ``keys[first_bad]``. Returns the chunks it dropped."""
        check_batch(keys, "report_verify")
        header, _ = self._call({"op": Op.VERIFY, "namespace": namespace, "keys": list(keys), "checks": checks,
                                "mismatches": mismatches, "max_difference": float(max_difference),
                                "first_bad": first_bad})
        return int(header["dropped"])

    def delete(self, keys: Sequence[bytes]) -> int:
        check_batch(keys, "delete")
        if not keys:
            return 0
        header, _ = self._call({"op": Op.DELETE, "keys": wire_keys(keys)})
        return int(header["deleted"])

    def clear(self) -> int:
        """Delete every chunk of this client's namespace; other namespaces' chunks stay. Returns how many went.

        Leased chunks go from the index at once and free their space when their lease ends."""
        header, _ = self._call({"op": Op.CLEAR})
        return int(header["cleared"])

    def stats(self) -> dict[str, Any]:
        header, _ = self._call({"op": Op.STATS})
        return header["stats"]

    def close(self) -> None:
        self._credit.settle(self)   # a queued put is published before the stream closes (call flush for errors)
        note = self._seen.take()
        if note is not None or getattr(self._transport, "holding", False):
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

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(address: str | None = None, namespace: str = DEFAULT_NAMESPACE,
            chunk_tokens: int = DEFAULT_CHUNK_TOKENS, timeout: float = 5.0, **kwargs: Any) -> Client:
    """Connect to a daemon (the default socket of ``kvstore serve`` when ``address`` is None)."""
    return Client(address, namespace, chunk_tokens, timeout, **kwargs)
