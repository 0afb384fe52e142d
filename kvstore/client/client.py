"""The client: the public surface engines and tools use to talk to a kvstore daemon.

Over ``ipc://`` the client maps the daemon's shared arena: ``put`` copies each buffer with one memcpy into the
arena space the daemon lent it and commits in one message (``credit.py``; reserve → copy → commit when it lends
none); ``get`` takes a lease and returns zero-copy, read-only views of the leased slots (``reads.py``). Over
``tcp://`` the same calls carry the bytes in ZeroMQ frames, and so, on the stream socket, does a local client
the daemon offers no arena (another user's: ``docs/operations/tenants.md``, or ``use_arena=False``). If the
daemon restarts, the client says hello again (re-mapping the new arena) and retries the request once
(``connection.py``). ``get_into`` copies chunks into the caller's buffers, for a local client straight out of
the arena without a round trip (``arena_read.py``); ``put(..., wait=False)`` returns once the bytes are in place
and the commit is sent (``credit.py``; ``flush`` reports). ``gpu=True`` (engines on the daemon's GPU) maps the GPU
tier's pool at hello (``mappings.py``), and ``get`` hands out tensor views of it for the chunks it holds.

A Client has one ``Connection`` (``connection.py``): the sockets, the hello (``settings.py`` checks the
constructor's arguments and makes it), what is mapped at hello (``mappings.py``), the put credit (``credit.py``)
and the one request path. This file owns the public operations and checks every argument once, as it comes in
(``arguments.py``): a wrong one is a UsageError, and the client raises nothing but KVStoreError. It hands the
work to one helper per idea: ``lookups.py`` (the shared index or the socket), ``writes.py`` (which way a put
goes, reservations), ``reads.py`` (leases, and reads without one), ``scrub_pass.py``. May call: those and the
connection, no private member of them.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import UsageError
from ..keys import KEY_SCHEME, chunk_keys as _chunk_keys
from ..protocol.engine_blocks import EngineBlocks
from ..protocol.engine_identity import EngineIdentity
from ..protocol.wire import Op
from ..security.curve import ClientCurve
from . import arguments, lookups, reads, writes
from .arena_read import read_into, read_with
from .buffers import stored_bytes, stored_size, writable_bytes
from .connection import Connection
from .credit import HeldCredit
from .lease import Lease, LookupResult, Reservation
from .pages import PagePopulator
from .scrub_pass import cancel as cancel_scrubs, run_pass
from .settings import DEFAULT_CHUNK_TOKENS, DEFAULT_NAMESPACE, ClientSettings
from .transport_base import RequestTransport
from ..mapped.arena import SharedArena
from ..mapped.index_reader import SharedIndexView

__all__ = ["Client", "Lease", "LookupResult", "Reservation", "connect"]


class Client:
    """A connection to one daemon. Not fork-safe; use one per thread for the best concurrency.

    ``address``, ``namespace``, ``chunk_tokens`` and ``timeout`` are the constructor's, checked; ``settings``
    (``settings.py``) holds every connect argument. Every method raises UsageError for an argument it does not
    accept (naming it), and otherwise only other KVStoreError subclasses: DaemonUnavailable, the daemon's error
    replies, ClientClosedError after ``close``."""

    def __init__(self, address: str | None = None, namespace: str = DEFAULT_NAMESPACE,
                 chunk_tokens: int = DEFAULT_CHUNK_TOKENS, timeout: float = 5.0,
                 client_id: str | None = None, use_arena: bool | None = None,
                 curve: ClientCurve | None = None, gpu: bool = False, pin_arena: bool = False,
                 key_scheme: str = KEY_SCHEME, hash_seed: int = 0,
                 shared_index: bool = True, stream: bool = True, credits: bool = True,
                 connector: dict[str, str] | None = None, identity: EngineIdentity | None = None) -> None:
        """Connect to the daemon at ``address`` (``ipc:///path`` or ``tcp://host:port``; None: the default
        socket of ``kvstore serve``) for the chunks of ``namespace``, each of ``chunk_tokens`` tokens.

        ``timeout``: seconds to wait for each reply. ``use_arena``: map the daemon's arena (default: for ipc://).
        ``curve``: CURVE keys for tcp:// (default: the ``KVSTORE_CURVE_*`` variables). ``gpu``: map the GPU tier's
        pool; ``pin_arena``: page-lock the arena mappings (CUDA). ``key_scheme``, ``hash_seed``: how the keys are
        made (a daemon holding the namespace's chunks made otherwise refuses the client). ``shared_index``,
        ``stream``, ``credits``: False turns off lookups from shared memory, the stream socket, one-message puts.
        ``connector``: an engine connector's report of itself (``kvstore stats``); ``identity``: the engine
        instance served (an ``EngineIdentity``: KV cache events of the namespace go on its topic).

        Raises:
            UsageError: a bad argument.
            DaemonUnavailable: no daemon answers.
            KVStoreError: the daemon's refusal as it is (VersionError, IncompatibleError, ...).
        """
        s = self.settings = ClientSettings.checked(address, namespace, chunk_tokens, timeout, client_id, use_arena,
                                                   gpu, pin_arena, key_scheme, hash_seed, shared_index, stream,
                                                   connector, identity)
        self.address, self.namespace, self.chunk_tokens, self.timeout = (s.address, s.namespace, s.chunk_tokens,
                                                                         s.timeout)
        self._conn = Connection(s, curve, credits)

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
        """One round trip to the daemon. Raises DaemonUnavailable when it does not answer."""
        self._conn.request({"op": Op.PING})

    def lookup(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` (a list of keys from ``chunk_keys``) are stored, in any tier. Pins nothing."""
        keys, packed = arguments.packed_keys("lookup", keys)
        return lookups.count(self._conn, packed)

    def lookup_many(self, chains: Sequence[Sequence[bytes]]) -> list[int]:
        """``lookup`` of several key chains: from the shared index where it answers, else in one round trip
        (the requests are pipelined)."""
        chains = arguments.sequence("lookup_many", "chains", chains, "key chains (lists of keys)")
        packed = [arguments.packed_keys("lookup_many", keys, f"chains[{i}]")[1] for i, keys in enumerate(chains)]
        return lookups.many(self._conn, packed)

    def lookup_tiers(self, keys: Sequence[bytes], promote: bool = True) -> LookupResult:
        """How many leading ``keys`` are stored and how many of those each tier holds. Read from the daemon's
        shared index where it can answer (``mapped/index_reader.py``), else asked over the socket."""
        keys, packed = arguments.packed_keys("lookup_tiers", keys)
        return lookups.tiers(self._conn, packed, promote)

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
        inline = self._conn.mapped.arena_view is None
        # The one conversion each buffer needs anyway (its size, or its bytes for a frame) checks it too
        converted = arguments.each("put", "buffers", buffers, stored_bytes if inline else stored_size,
                                   arguments.BUFFERS)
        arguments.same_length("put", keys, "buffers", converted)
        extra = arguments.write_fields("put", keys, engine, ask)
        if not wait and self._conn.credit.error is not None:
            self.flush()   # raises the queued puts' error
        if not keys:
            return 0 if wait else None
        return writes.put(self._conn, packed, buffers, converted, parent, extra, wait, ask.stores, inline)

    def flush(self) -> int:
        """Wait for the puts sent with ``wait=False``: how many chunks they wrote since the last flush; raises
        the first error one of them met."""
        self._conn.credit.settle(wait=True)
        return self._conn.credit.take_result()

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
        mapped = self._conn.mapped.arena_view is not None
        if not mapped and (not self.settings.use_arena or not self.address.startswith("ipc://")):
            raise UsageError("reserve needs the shared arena (an ipc:// client with use_arena); use put over tcp://")
        extra = arguments.write_fields("reserve", keys, engine, ask)
        if not mapped:   # the daemon offers us no arena (another user's client): the bytes go inline
            return writes.reserve_inline(self._conn, packed, checked, parent, extra, ask.stores)
        return writes.reserve(self._conn, packed, checked, parent, extra)

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
        return reads.leased(self._conn, keys, packed, verify)

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
        copied = None if verify else reads.from_arena(self._conn, read_into, packed, outs)
        if copied is not None:
            return copied
        with self.get(keys, verify=verify) as views:
            return reads.copy_views(views, outs)

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
        given = reads.from_arena(self._conn, read_with, packed, copy)
        if given is not None:
            return given
        with self.get(keys) as views:
            copy(list(views))
            return len(views)

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
        return run_pass(self._conn.request, rate, timeout, progress)

    def scrub_cancel(self) -> int:
        """Stop every scrub pass clients started on this daemon; returns how many were running."""
        return len(cancel_scrubs(self._conn.request))

    def report_verify(self, namespace: str, keys: Sequence[bytes], checks: int, mismatches: int,
                      max_difference: float, first_bad: int | None = None) -> int:
        """Tell the daemon how computed KV compared with its chunks ``keys``; a mismatch makes it drop the chain
        from ``keys[first_bad]``. Returns the chunks it dropped."""
        arguments.text("report_verify", "namespace", namespace)
        keys, packed = arguments.packed_keys("report_verify", keys)
        header, _ = self._conn.request({"op": Op.VERIFY, "namespace": namespace, "keys": packed, "checks": checks,
                                        "mismatches": mismatches, "max_difference": float(max_difference),
                                        "first_bad": first_bad})
        return int(header["dropped"])

    def delete(self, keys: Sequence[bytes]) -> int:
        """Delete ``keys`` (and nothing else); returns how many were stored."""
        keys, packed = arguments.packed_keys("delete", keys)
        if not keys:
            return 0
        header, _ = self._conn.request({"op": Op.DELETE, "keys": packed})
        return int(header["deleted"])

    def clear(self) -> int:
        """Delete every chunk of this client's namespace; other namespaces' chunks stay. Returns how many went.

        Leased chunks go from the index at once and free their space when their lease ends."""
        header, _ = self._conn.request({"op": Op.CLEAR})
        return int(header["cleared"])

    def stats(self) -> dict[str, Any]:
        """The daemon's figures (what ``kvstore stats`` shows): tiers, counters, credits, leases, ..."""
        header, _ = self._conn.request({"op": Op.STATS})
        return header["stats"]

    def reload(self) -> dict[str, Any]:
        """Have the daemon read its config file's tenants table again and apply it (``kvstore reload``).

        Returns:
            ``applied`` (bool), ``tenants`` (the names in force), ``needs_restart`` (settings that changed in the
            file and wait for a restart) and ``error`` (why the table was refused; the old one stays in force).
        """
        header, _ = self._conn.request({"op": Op.RELOAD})
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
        header, _ = self._conn.request({"op": Op.INVALIDATE, "namespaces": names, "prefix": bool(prefix)})
        return {k: header[k] for k in ("chunks", "adopting", "remote_deleted", "remote_failed")}

    # -- the connection: requests of any kind, what it maps, what it holds ------------------------------------
    def request(self, header: dict[str, Any], payloads: list[Any] | None = None,
                retry: bool = True) -> tuple[dict[str, Any], list[Any]]:
        """Send any request and wait for its reply, as the operations above do: the public way to send what no
        method sends (a test's malformed request, a tool's rare operation).

        Args:
            header: the request's fields: ``op`` (a ``protocol.wire.Op``) and its arguments.
            payloads: buffers sent after the header (an inline put's chunks).
            retry: send it again once, after a new hello, should the daemon have restarted; False: raise
                VersionError then (a request whose effect may or may not have happened).

        Returns:
            The reply's header and its payloads.

        Raises:
            KVStoreError: the daemon's error reply (its class per code), DaemonUnavailable, ClientClosedError.
        """
        return self._conn.request(header, payloads, retry)

    @property
    def transport(self) -> RequestTransport:
        """Where requests go now (the stream socket, else ZeroMQ), below ``request``: no retry, no notes."""
        return self._conn.transport

    @property
    def server_info(self) -> dict[str, Any]:
        """The daemon's reply to the last hello (its arena, index, GPU pool, alignment, limits, ...)."""
        return self._conn.server_info

    @property
    def arena(self) -> SharedArena | None:
        """The mapped arena, or None; another object once a restarted daemon's arena is mapped."""
        return self._conn.mapped.arena

    @property
    def arena_view(self) -> memoryview | None:
        """The read-write view of the mapped arena (None without one): slots this client was lent are in it."""
        return self._conn.mapped.arena_view

    @property
    def pages(self) -> PagePopulator | None:
        """The page populator of the read-write view of the arena, or None."""
        return self._conn.mapped.pages

    @property
    def shared_index(self) -> SharedIndexView | None:
        """The daemon's shared index as this client maps it (its ``answered`` and ``deferred`` counts), or None."""
        return self._conn.mapped.index

    @property
    def gpu_pool(self) -> Any:
        """The mapped GPU pool (``kvstore.mapped.gpu_pool.MappedPool``), or None."""
        return self._conn.mapped.gpu_pool

    @property
    def held_credit(self) -> HeldCredit | None:
        """The put credit this client holds now (``credit.py``: its id, offset and size in the arena), or None."""
        return self._conn.credit.held

    def populate_arena(self) -> int:
        """Populate this client's whole mapping of the arena now, instead of range by range as requests first
        touch it (``pages.py``): for a client that wants its first puts and gets as fast as later ones.

        Returns:
            The bytes of arena populated (0 without an arena, over tcp://); both mappings (read-write for puts,
            read-only for gets) are populated, which costs about 0.6 s per GiB of arena each here.
        """
        return self._conn.mapped.populate()

    def note_load(self, medium: str, nbytes: int, seconds: float) -> None:
        """Tell the daemon that loading ``nbytes`` from ``medium`` took ``seconds``, from asking for the chunks to
        the end of their copy into the engine: the daemon publishes what a KiB costs per medium for routers
        (``load_ns_per_kib`` in stats). ``medium``: "CPU" (the shared arena) or "GPU" (the GPU pool). Summed here
        and sent without waiting for a reply, at most once a second.

        Raises:
            UsageError: another medium, or a negative size or time.
        """
        self._conn.note_load(medium, nbytes, seconds)

    def close(self) -> None:
        """Publish a queued put, tell the daemon the last lookups, and close the sockets and mappings. Idempotent;
        every later call raises ClientClosedError."""
        self._conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(address: str | None = None, namespace: str = DEFAULT_NAMESPACE,
            chunk_tokens: int = DEFAULT_CHUNK_TOKENS, timeout: float = 5.0, **kwargs: Any) -> Client:
    """Connect to a daemon (the default socket of ``kvstore serve`` when ``address`` is None); see ``Client``'s
    constructor for the arguments."""
    return Client(address, namespace, chunk_tokens, timeout, **kwargs)

