"""The client: the public surface engines and tools use to talk to a kvstore daemon.

Over ``ipc://`` the client maps the daemon's shared arena: ``put`` copies each buffer with one memcpy into the
arena space the daemon lent it and commits in one message (``credit.py``; reserve → copy → commit when it lends
none); ``get`` takes a lease and returns zero-copy, read-only views of the leased slots. Over
``tcp://`` the same calls carry the bytes in ZeroMQ frames, and so, on the stream socket, does a local client
the daemon offers no arena (another user's: ``docs/operations/tenants.md``, or ``use_arena=False``). If the
daemon restarts, the client says hello again (re-mapping the new arena) and retries the request once
(``session.py``). ``get_into`` copies chunks into
the caller's buffers, for a local client straight out of the arena without a round trip (``arena_read.py``);
``put(..., wait=False)`` returns once the bytes are in place and the commit is sent (``credit.py``; ``flush``
reports).

Views handed to callers never let them change what other readers get: they are read-only memoryviews, and over
``ipc://`` they are windows on a read-only mapping of the arena (``mappings.py``), so even a tensor made from one
(torch does not honour the flag) cannot write into the stored chunk. Every argument is checked once, as it comes
in (``arguments.py``): a wrong one is a UsageError, and the client raises nothing but KVStoreError.

Around this file: ``session.py`` (the hello and where requests go), ``lease.py`` (what get and reserve hand
back), ``mappings.py`` (the arena, index and GPU pool mapped at hello), ``credit.py`` (put credits),
``shared_index.py`` (lookups from shared memory), ``copies.py`` (large batches copied by two threads), the
transports.

``gpu=True`` (engines on the daemon's GPU): the client asks for the GPU tier's pool at hello, maps it once
(``kvstore.mapped.gpu_pool.MappedPool``) and page-locks its own mappings of the arena; ``get`` then returns a
``uint8`` tensor view of the pool for every chunk the GPU tier holds, and memoryviews for the others. Only such
clients import torch. Without the mapping (no GPU tier, another GPU, CUDA IPC refused) everything is read from
DRAM as usual: the daemon copies GPU-only chunks down for readers that do not map the pool.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import DaemonUnavailable, UsageError, VersionError
from ..keys import KEY_BYTES
from ..keys import chunk_keys as _chunk_keys
from ..protocol.engine_blocks import EngineBlocks
from ..protocol.retention import wire_retention
from ..protocol.wire import Op
from . import arguments
from .arena_read import read_into, read_with
from .buffers import copy_into, copy_out, nbytes_of, stored_bytes, stored_size, writable_bytes
from .copies import copy_batch
from .lease import InlineReservation, Lease, LookupResult, Reservation
from .scrub_pass import cancel as cancel_scrubs
from .scrub_pass import run_pass
from .session import DEFAULT_CHUNK_TOKENS, DEFAULT_NAMESPACE, Session
from ..mapped.index_reader import tiers_of
from .transport_base import ConnectionLost

if TYPE_CHECKING:
    from .port import SessionPort

__all__ = ["Client", "Lease", "LookupResult", "Reservation", "connect"]


class Client(Session):
    """A connection to one daemon. Not fork-safe; use one per thread for the best concurrency.

    Every method raises UsageError for an argument it does not accept (naming it), and otherwise only other
    KVStoreError subclasses: DaemonUnavailable, the daemon's error replies, ClientClosedError after ``close``."""

    # -- keys -----------------------------------------------------------------------------------------------
    def chunk_keys(self, token_ids: Sequence[int] | Any, include_partial: bool = False,
                   namespace: str | None = None, chunk_tokens: int | None = None) -> list[bytes]:
        """One chained key per full chunk of ``token_ids`` (and the short tail if ``include_partial``).

        ``token_ids``: one sequence of integer ids (a list, a 1-D array or tensor, or a 2-D one with a single
        row); a batch of rows is refused (UsageError), as its keys would chain one row onto the other.
        ``namespace`` and ``chunk_tokens`` default to the client's; a connector serving several models through
        one client passes each model's own.
        """
        if namespace is not None:
            arguments.text("chunk_keys", "namespace", namespace)
        return _chunk_keys(namespace or self.namespace, token_ids,
                           self.chunk_tokens if chunk_tokens is None else chunk_tokens, include_partial)

    # -- operations ------------------------------------------------------------------------------------------
    def ping(self) -> None:
        self._call({"op": Op.PING})

    def lookup(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` (a list of keys from ``chunk_keys``) are stored, in any tier. Pins nothing."""
        keys, packed = arguments.packed_keys("lookup", keys)
        return self._count(packed)

    def _count(self, packed: bytes) -> int:
        local = self._lookup_local(packed, True) if packed else None
        return local[0] if local is not None else self._lookup_tiers(packed, True).count

    def lookup_many(self, chains: Sequence[Sequence[bytes]]) -> list[int]:
        """``lookup`` of several key chains: from the shared index where it answers, else in one round trip
        (the requests are pipelined)."""
        chains = arguments.sequence("lookup_many", "chains", chains, "key chains (lists of keys)")
        packed = [arguments.packed_keys("lookup_many", keys, f"chains[{i}]")[1] for i, keys in enumerate(chains)]
        if self._index is not None and self._transport.alive():
            return [self._count(keys) for keys in packed]
        try:
            return self._lookup_many(packed)
        except (VersionError, ConnectionLost):
            self._hello()  # the daemon restarted and forgot us
            return self._lookup_many(packed)

    def _lookup_many(self, chains: list[bytes]) -> list[int]:
        if self._credit.queued is not None:
            self._credit.settle(self)
        if self._seen:
            self._send_seen(hold=True)
        ids = [self._transport.send({"op": Op.LOOKUP, "keys": keys, "promote": True}) if keys else 0
               for keys in chains]
        counts, error = [], None
        for rid in ids:  # every reply is waited for (or given up on), so none is left behind when one fails
            try:
                wait: float | None = 0.0 if isinstance(error, DaemonUnavailable) else None
                counts.append(int(self._transport.wait(rid, wait)[0]["count"]) if rid else 0)
            except Exception as exc:  # noqa: BLE001 - re-raised below, once the others are in
                error = error or exc
                counts.append(0)
        if error is not None:
            raise error
        return counts

    def lookup_tiers(self, keys: Sequence[bytes], promote: bool = True) -> LookupResult:
        """How many leading ``keys`` are stored and how many of those each tier holds. Read from the daemon's
        shared index where it can answer (``mapped/index_reader.py``), else asked over the socket."""
        keys, packed = arguments.packed_keys("lookup_tiers", keys)
        return self._lookup_tiers(packed, promote)

    def _lookup_tiers(self, packed: bytes, promote: bool) -> LookupResult:
        if not packed:
            return LookupResult(0, {})
        local = self._lookup_local(packed, promote)
        if local is not None:
            return LookupResult(local[0], tiers_of(local[1]))
        header, _ = self._call({"op": Op.LOOKUP, "keys": packed, "promote": promote})
        return LookupResult(int(header["count"]), dict(header.get("tiers", {})))

    def _lookup_local(self, packed: bytes, promote: bool) -> tuple[int, list[int], bytes] | None:
        """The shared index's answer (leading keys stored, count per state, those keys packed), or None: ask the
        socket."""
        if self._credit.queued is not None:
            self._credit.settle(self)   # a lookup sees this client's queued puts
        if self._index is None or not self._transport.alive():
            return None
        answer = self._index.answer(packed, promote)
        if answer is not None and self._seen.add_packed(len(packed) // KEY_BYTES, answer[2]):
            self._send_seen()   # now: what watches the daemon sees a lookup even if this client idles
        return answer

    def put(self, keys: Sequence[bytes], buffers: Sequence[Any], parent: bytes | None = None,
            wait: bool = True, engine: Sequence[EngineBlocks | None] | None = None, retention: str = "normal",
            pin_ttl: float | None = None) -> int | None:
        """Store one buffer (bytes-like or tensor) per key; keys already stored are skipped.

        ``parent`` is the key that precedes ``keys[0]`` in its chain, if any. Returns how many chunks were
        written. Raises StoreFullError when the daemon cannot make room.

        ``wait=False`` (a local client): return None once the bytes are in the arena and the commit is sent,
        without waiting for the daemon to publish them; ``flush`` returns how many chunks such puts wrote and
        raises the first error one met (so does the next ``put``). Any read or request of this client waits for
        the queued commit first, so it sees the chunks.

        ``engine``: per key, the engine's names of the chunk's blocks (``EngineBlocks``: its block hashes, parent
        hash, token ids, one block size for the put) or None; the daemon's KV cache events then name the chunk's
        blocks as the engine does.

        ``retention``: how the daemon keeps the chunks under pressure (``docs/operations/tenants.md``): ``low``
        (evicted first), ``normal``, ``high``, ``pin`` (not evicted for ``pin_ttl`` seconds, or the daemon's
        ``--pin-ttl``; bounded, past the bound kept as ``high``) or ``no-store`` (acknowledged, nothing stored:
        returns 0). Raises UsageError for a bad argument.
        """
        ask = arguments.retention("put", retention, pin_ttl)
        keys, packed = arguments.packed_keys("put", keys)
        parent = arguments.optional_key("put", "parent", parent)
        inline = self._arena_view is None
        # The one conversion each buffer needs anyway (its size, or its bytes for a frame) checks it too
        converted = arguments.each("put", "buffers", buffers, stored_bytes if inline else stored_size,
                                   arguments.BUFFERS)
        arguments.same_length("put", keys, "buffers", converted)
        extra = arguments.engine_blocks("put", keys, engine)
        extra = {"engine": extra} if extra is not None else {}
        extra.update(wire_retention(ask))
        if not wait and self._credit.error is not None:
            self.flush()   # raises the queued puts' error
        if not keys:
            return 0 if wait else None
        if not ask.stores:   # one request, no bytes: the daemon acknowledges and counts it
            return self._not_waited(self._put_inline(packed, [], parent, extra), wait)
        if inline:
            return self._not_waited(self._put_inline(packed, converted, parent, extra), wait)
        committed = self._credit.put(self, packed, buffers, converted, parent, wait, extra)
        if committed is not None:
            return committed if wait else None
        return self._not_waited(self._put_reserved(packed, buffers, converted, parent, extra), wait)

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

    def _put_reserved(self, packed: bytes, buffers: Sequence[Any], sizes: list[int],
                      parent: bytes | None, extra: dict[str, Any] | None = None) -> int:
        reservation = self._reserve(packed, sizes, parent, extra)
        try:
            todo = [(view, buf) for view, buf in zip(reservation.views, buffers) if view is not None]
            copy_batch(copy_into, todo, [view.nbytes for view, _ in todo])
        except BaseException:
            reservation.abort()
            raise
        return reservation.commit()

    def reserve(self, keys: Sequence[bytes], sizes: Sequence[int], parent: bytes | None = None,
                engine: Sequence[EngineBlocks | None] | None = None, retention: str = "normal",
                pin_ttl: float | None = None) -> Reservation:
        """Reserve arena slots of ``sizes`` bytes (positive integers, one per key) for ``keys`` (ipc:// only); see
        ``Reservation``; ``engine``, ``retention`` and ``pin_ttl`` as ``put`` takes them (``no-store``: every
        view is None and the commit writes nothing). A local client the daemon offers no arena (another user's)
        gets buffers of its own, sent at the commit (``InlineReservation``). Raises UsageError over tcp:// or with
        ``use_arena=False`` (use ``put``), or for a bad argument."""
        ask = arguments.retention("reserve", retention, pin_ttl)
        keys, packed = arguments.packed_keys("reserve", keys)
        checked = arguments.sizes("reserve", sizes)
        arguments.same_length("reserve", keys, "sizes", checked)
        parent = arguments.optional_key("reserve", "parent", parent)
        if self._arena_view is None and (not self.use_arena or not self.address.startswith("ipc://")):
            raise UsageError("reserve needs the shared arena (an ipc:// client with use_arena); use put over tcp://")
        extra = arguments.engine_blocks("reserve", keys, engine)
        extra = {**({"engine": extra} if extra is not None else {}), **wire_retention(ask)}
        if self._arena_view is None:   # the daemon offers us no arena (another user's client): the bytes go inline
            request = {"op": Op.PUT_INLINE, "keys": packed, "parent": parent, **extra}
            return InlineReservation(self, request, checked, ask.stores)
        return self._reserve(packed, checked, parent, extra)

    def _reserve(self, packed: bytes, sizes: list[int], parent: bytes | None,
                 extra: dict[str, Any] | None = None) -> Reservation:
        offered = self._credit.offer(self)   # the space lent to us may be what is missing: the daemon frees it then
        request = {"op": Op.RESERVE, "keys": packed, "sizes": sizes, "parent": parent,
                   "credit": offered.id if offered else 0, **(extra or {})}
        header = None
        try:
            header, _ = self._call(request)
        finally:
            self._credit.offer_done(self, offered, header)
        views: list[memoryview | None] = []
        for slot in header["slots"]:   # the writer's own slots: of the read-write mapping
            if slot is None:
                views.append(None)
                continue
            assert self._arena_view is not None, "slots are given only to a client that maps the arena"
            if self._pages is not None:
                self._pages.touch(slot[0], slot[1])
            views.append(self._arena_view[slot[0]:slot[0] + slot[1]])
        return Reservation(self, int(header["reservation"]), views)

    def _put_inline(self, packed: bytes, payloads: list[Any], parent: bytes | None,
                    extra: dict[str, Any] | None = None) -> int:
        header, _ = self._call({"op": Op.PUT_INLINE, "keys": packed, "parent": parent, **(extra or {})}, payloads)
        return int(header["committed"])

    def get(self, keys: Sequence[bytes], verify: bool = False) -> Lease:
        """Lease the longest stored prefix of ``keys``; ``len(lease.views) <= len(keys)``.

        Use as ``with client.get(keys) as views:``. The views are read-only: over ipc:// zero-copy windows on a
        read-only mapping of the shared arena, valid until the lease is released; over tcp:// the received
        frames. Read them, copy them out, or make a tensor of them to read (``docs/guide/python-client.md``);
        a write through one raises, or — through a tensor — faults. ``verify``: check every view against the
        chunk's checksum and hand out only the leading run that matches (see ``client/verify.py``); a chunk that
        fails is a miss, reported to the daemon.
        """
        keys, packed = arguments.packed_keys("get", keys)
        if not keys:
            return Lease(self, 0, [])
        sent = time.monotonic()
        header, payload = self._call({"op": Op.GET, "keys": packed, "inline": self._read_view is None,
                                      "gpu": self._gpu_pool is not None and not verify, "verify": verify})
        slots = header["slots"]
        arena = self._read_view
        if arena is None:
            lease = Lease(self, 0, [_frame_view(frame) for frame in payload])
        else:
            assert self._read_pages is not None   # mapped with the read view
            tiers = header.get("tiers") or ["host"] * len(slots)
            for (off, size), tier in zip(slots, tiers):
                if tier != "gpu" or self._gpu_pool is None:
                    self._read_pages.touch(off, size)
            views = [self._gpu_pool.view(off, size) if tier == "gpu" and self._gpu_pool is not None
                     else arena[off:off + size] for (off, size), tier in zip(slots, tiers)]
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
        keys, packed = arguments.packed_keys("get_into", keys)
        outs = arguments.each("get_into", "dests", dests, writable_bytes, arguments.DESTS)
        arguments.same_length("get_into", keys, "destinations", outs)
        if not keys:
            return 0
        if self._credit.queued is not None:
            self._credit.settle(self)   # a read sees this client's queued puts
        copied = None if verify else self._from_arena(read_into, packed, outs)
        if copied is not None:
            return copied
        with self.get(keys, verify=verify) as views:
            pairs, sizes = [], []
            for i, (view, out) in enumerate(zip(views, outs)):
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

        The views (read-only ``memoryview``s of the arena, or of received frames over tcp://) are valid only during
        the call. A local client reads them straight from the arena without a round trip where the daemon's index
        can answer, and checks afterwards that none changed under the call (``client/arena_read.py``); when one
        did, ``copy`` is called again with what is there now, so it must write only into buffers of its own and
        redo its whole copy each time. Otherwise the chunks are leased for the call."""
        keys, packed = arguments.packed_keys("read", keys)
        if not callable(copy):
            raise UsageError(f"read: copy must be a function taking a list of views; got {arguments.describe(copy)}")
        if not keys:
            return 0
        if self._credit.queued is not None:
            self._credit.settle(self)   # a read sees this client's queued puts
        given = self._from_arena(read_with, packed, copy)
        if given is not None:
            return given
        with self.get(keys) as views:
            copy(list(views))
            return len(views)

    def _from_arena(self, read: Callable[..., int | None], packed: bytes, target: Any) -> int | None:
        """A read straight from the arena through the daemon's index (``arena_read.py``: ``read_into`` or
        ``read_with``, into ``target``), told to the daemon in the next note; the chunks read, or None: lease them."""
        if self._index is None or self._read_view is None or not self._transport.alive():
            return None
        count = read(self._index, self._read_view, self._read_pages, packed, target)
        if count is None:
            return None
        if count and self._seen.add_read(packed[:KEY_BYTES * count]):
            self._send_seen()
        return count

    def scrub(self, rate: int = 0, timeout: float | None = None,
              progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Have the daemon check every copy of every chunk now, at most ``rate`` bytes/s (0: no bound); its counts
        per tier. ``progress`` gets the pass's figures twice a second; after ``timeout`` seconds (None: never) or an
        interrupt the pass is stopped, the counts covering what it checked (``cancelled``). See scrub_pass.py.

        Raises:
            UsageError: ``rate`` is negative or ``timeout`` is not a positive number of seconds.
        """
        arguments.non_negative("scrub", "rate", rate)
        if timeout is not None:
            timeout = arguments.positive_seconds("scrub", "timeout", timeout)
        return run_pass(self._call, rate, timeout, progress)

    def scrub_cancel(self) -> int:
        """Stop every scrub pass clients started on this daemon; returns how many were running."""
        return len(cancel_scrubs(self._call))

    def report_verify(self, namespace: str, keys: Sequence[bytes], checks: int, mismatches: int,
                      max_difference: float, first_bad: int | None = None) -> int:
        """Tell the daemon how computed KV compared with its chunks ``keys``; a mismatch makes it drop the chain
        from ``keys[first_bad]``. Returns the chunks it dropped."""
        arguments.text("report_verify", "namespace", namespace)
        keys, packed = arguments.packed_keys("report_verify", keys)
        header, _ = self._call({"op": Op.VERIFY, "namespace": namespace, "keys": packed, "checks": checks,
                                "mismatches": mismatches, "max_difference": float(max_difference),
                                "first_bad": first_bad})
        return int(header["dropped"])

    def delete(self, keys: Sequence[bytes]) -> int:
        """Delete ``keys`` (and nothing else); returns how many were stored."""
        keys, packed = arguments.packed_keys("delete", keys)
        if not keys:
            return 0
        header, _ = self._call({"op": Op.DELETE, "keys": packed})
        return int(header["deleted"])

    def clear(self) -> int:
        """Delete every chunk of this client's namespace; other namespaces' chunks stay. Returns how many went.

        Leased chunks go from the index at once and free their space when their lease ends."""
        header, _ = self._call({"op": Op.CLEAR})
        return int(header["cleared"])

    def stats(self) -> dict[str, Any]:
        header, _ = self._call({"op": Op.STATS})
        return header["stats"]

    def reload(self) -> dict[str, Any]:
        """Have the daemon read its config file's tenants table again and apply it (``kvstore reload``).

        Returns:
            ``applied`` (bool), ``tenants`` (the names in force), ``needs_restart`` (settings that changed in the
            file and wait for a restart) and ``error`` (why the table was refused; the old one stays in force).
        """
        header, _ = self._call({"op": Op.RELOAD})
        return {k: header[k] for k in ("applied", "tenants", "needs_restart", "error")}

    def invalidate(self, namespaces: Sequence[str], prefix: bool = False) -> dict[str, Any]:
        """Have the daemon drop every chunk of ``namespaces`` from every tier it holds (``kvstore invalidate``);
        taken only from a local client of the daemon's own user (or root).

        Args:
            namespaces: the namespaces to drop (any, not only this client's).
            prefix: each name is a prefix: every namespace the daemon holds that starts with it (not empty).

        Returns:
            ``chunks`` (per namespace dropped: its chunks that went), ``adopting`` (chunks of a kept arena dropped
            before adoption), ``remote_deleted`` (values the remote store removed) and ``remote_failed``.

        Raises:
            PermissionDeniedError: the client is not the daemon's user (nor root) on its host.
            UsageError: ``namespaces`` is empty or not a list of strings.
        """
        names = list(namespaces) if not isinstance(namespaces, str) else [namespaces]
        if not names or not all(isinstance(n, str) for n in names):
            raise UsageError("invalidate takes one namespace or more, as a list of strings")
        header, _ = self._call({"op": Op.INVALIDATE, "namespaces": names, "prefix": bool(prefix)})
        return {k: header[k] for k in ("chunks", "adopting", "remote_deleted", "remote_failed")}

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _frame_view(frame: Any) -> memoryview:
    """A read-only view of one received payload: a ZeroMQ frame's buffer, or the stream socket's bytes."""
    return (frame.buffer if hasattr(frame, "buffer") else memoryview(frame)).toreadonly()


def connect(address: str | None = None, namespace: str = DEFAULT_NAMESPACE,
            chunk_tokens: int = DEFAULT_CHUNK_TOKENS, timeout: float = 5.0, **kwargs: Any) -> Client:
    """Connect to a daemon (the default socket of ``kvstore serve`` when ``address`` is None); see ``Client``'s
    constructor (``Session.__init__``) for the arguments."""
    return Client(address, namespace, chunk_tokens, timeout, **kwargs)


if TYPE_CHECKING:
    def _implements_session_port(client: Client) -> SessionPort:
        return client   # the type checker proves that a Client is the SessionPort its leases and credits use
