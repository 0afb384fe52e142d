"""What a get and a reserve hand back: a lease on chunks being read, a reservation of slots being written.

Both hold daemon-side resources (pins, reserved slots) that only their ``release``/``commit``/``abort`` give back
(or their TTL, or the client's session ending), and both hold views into the client's arena mapping, which they
release first so that the mapping can go when the client closes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from ..errors import ClientClosedError, DaemonUnavailable, LeaseError, VersionError
from ..protocol.wire import Op
from .port import ConnectionPort


@dataclass(frozen=True)
class LookupResult:
    count: int                 # leading keys stored, in any tier
    tiers: dict[str, int]      # how many of those leading keys each tier holds


class Lease:
    """Zero-copy views of leased chunks; the chunks stay pinned until ``release``.

    A view is a memoryview of the shared arena, or — for a client that maps the GPU pool — a ``uint8`` tensor of
    the pool for a chunk the GPU tier holds (``tiers[i]`` says which: "gpu" or "host").

    The views never change under the reader without the reader learning it. A local client whose process the
    daemon follows keeps its leases past the TTL for as long as it lives. Any other client (one in another pid
    namespace) may lose a lease at its TTL, after which other chunks may be written under its views: so a
    release later than the TTL (counted from before the get was sent, so never late) asks the daemon whether the
    lease was still held, and ``release`` (and leaving the ``with`` block) raises ``LeaseError`` when it was not:
    whatever was computed from the views must then be thrown away.
    """

    def __init__(self, conn: ConnectionPort, lease_id: int, views: list[Any], tiers: list[str] | None = None,
                 valid_until: float = math.inf) -> None:
        self._conn = conn
        self.id = lease_id
        self.views = views
        self.tiers = tiers if tiers is not None else ["host"] * len(views)
        self._valid_until = valid_until   # time.monotonic() before which the daemon cannot have expired it
        self._arena = conn.mapped.arena   # a daemon restarted since maps another arena: these views were left alone

    def __enter__(self) -> list[Any]:
        return self.views

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.release()
        except LeaseError:
            if exc_type is None:
                raise   # the block's own error, if any, is the one to report

    def __len__(self) -> int:
        return len(self.views)

    def extend(self) -> float:
        """Push the lease's deadline out by its TTL; returns the seconds left."""
        sent = time.monotonic()
        header, _ = self._conn.request({"op": Op.EXTEND, "lease": self.id})
        ttl = float(header["ttl"])
        self._valid_until = max(self._valid_until, sent + ttl)
        return ttl

    def release(self) -> None:
        """Unpin the chunks. The views are invalid afterwards (using them raises ValueError).

        Raises LeaseError if the lease had already been taken back (see the class docstring)."""
        for view in self.views:
            if isinstance(view, memoryview):
                view.release()
        self.views = []
        if not self.id:
            return
        lease_id, self.id = self.id, 0
        if time.monotonic() < self._valid_until:
            try:
                # Nothing to wait for: the lease is held, and a restarted daemon pins nothing anyway.
                self._conn.transport.send({"op": Op.RELEASE, "lease": lease_id}, want_reply=False)
            except (DaemonUnavailable, ClientClosedError):
                pass  # the daemon is gone (nothing is pinned, nothing wrote under the views), or we closed
            return
        if self._conn.mapped.arena is not self._arena:
            return   # the daemon restarted: nothing wrote into the old arena under these views
        try:
            self._conn.transport.call({"op": Op.RELEASE, "lease": lease_id})   # past the TTL: was it held?
        except (DaemonUnavailable, VersionError, ClientClosedError):
            pass   # the daemon is gone or restarted (it wrote into a new arena, not under these views), or we closed
        except LeaseError:
            raise LeaseError(f"lease {lease_id} was taken back at its TTL before it was released: other chunks "
                             f"may have been written under its views; discard what was read from them") from None


class Reservation:
    """Arena slots reserved for new chunks: fill ``views`` (None: that key is already stored), then ``commit``.

    The two halves of ``put`` for callers that write the bytes themselves, e.g. an engine gathering KV
    straight into the slots. Uncommitted slots are freed by ``abort`` (or when the reservation's TTL passes)."""

    def __init__(self, conn: ConnectionPort, reservation_id: int, views: list[memoryview | None]) -> None:
        self._conn = conn
        self.id = reservation_id
        self.views = views

    def commit(self) -> int:
        """Publish the filled chunks; returns how many were written."""
        rid, self.id = self.id, 0
        self._release_views()
        if not rid:
            return 0   # a no-store reservation: the daemon reserved nothing
        header, _ = self._conn.request({"op": Op.COMMIT, "reservation": rid}, retry=False)
        return int(header["committed"])

    def abort(self) -> None:
        rid, self.id = self.id, 0
        self._release_views()
        if rid:
            self._conn.request({"op": Op.ABORT, "reservation": rid}, retry=False)

    def _release_views(self) -> None:
        for view in self.views:
            if view is not None:
                view.release()
        self.views = []


class InlineReservation(Reservation):
    """A reservation for a local client the daemon offers no arena (another user's, ``docs/operations/tenants.md``):
    the views are buffers of the client's own, and ``commit`` sends their bytes in one PUT_INLINE, so code that
    writes into reserved slots (an engine connector's saves) works unchanged. Nothing is held in the daemon before
    the commit; every key gets a view (the daemon skips those already stored at the commit)."""

    def __init__(self, conn: ConnectionPort, request: dict[str, Any], sizes: list[int], stores: bool) -> None:
        buffers = [bytearray(n) for n in sizes] if stores else []
        super().__init__(conn, 0, [memoryview(b) for b in buffers] if stores else [None] * len(sizes))
        self._request: dict[str, Any] | None = request   # the PUT_INLINE the commit sends, less its payloads
        self._buffers = buffers   # sent themselves, not the views: the views are released after the send

    def commit(self) -> int:
        """Send the filled buffers; returns how many chunks were written."""
        request, self._request = self._request, None
        payloads, self._buffers = self._buffers, []
        try:
            if request is None:
                return 0
            header, _ = self._conn.request(request, payloads)
            return int(header["committed"])
        finally:
            self._release_views()

    def abort(self) -> None:
        self._request, self._buffers = None, []
        self._release_views()
