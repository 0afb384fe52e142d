"""The writer's end of a put credit (``store/credits.py``): a put in one round trip.

The client holds at most one credit, an extent of the daemon's arena lent to it. A put lays its chunks out at
page-aligned offsets from the credit's start, copies them in, and sends one ``CREDIT_PUT``; the reply publishes
the chunks and names the credit for the next put. A put falls back to reserve + commit (``None`` from ``put``)
when the daemon lends no credit (an older daemon, no room, the share of the arena lent is used up), when the
chunks do not fit the largest credit it lends, and while another thread of the client is writing into the
credit. A reserve names the credit held, if any: should the room be short, the daemon frees it and tries once
more, so a writer whose own credit held the room needs one request, and meets no error it would not see. A
refused credit is not asked for again for a second, so a full store does not cost a third round trip per put.

A request about the credit forgets it until its reply names the next one: after a timeout the client never
writes into space the daemon may have published meanwhile (the daemon frees the credit the client forgot).

The writer belongs to one connection (``connection.py``), which hands it itself: the writer sends through the
connection's raw path (``call``, ``send``, ``reply``) and never through ``request``, which settles the queued put
first. ``settle`` is the one place a queued put's reply is read: the connection calls it before each request and
each read of the arena, and ``put`` before it picks a credit.

A credit is written only while its daemon still serves (``daemon_still_serving``, checked before the copy): a
restarted daemon may adopt the same arena (a warm restart) and lend that space to someone else.

The credit's deadline is the daemon's reservation TTL counted from before the request that lent it; a credit
past half of it is renewed before any byte is copied in, so bytes are never written into space the daemon may
already have taken back (it spares the credits of local clients whose process it follows anyway).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import KVStoreError, ReservationError, VersionError
from ..protocol.wire import Op
from .buffers import copy_into
from .copies import copy_batch
from .port import ConnectionPort


RENEW_AT = 0.5          # share of the TTL after which a credit is renewed before use
REFUSED_BACKOFF_S = 1.0
GROWTH = 2              # a credit twice the put's size: a somewhat larger next put still fits


@dataclass(frozen=True)
class HeldCredit:
    id: int
    offset: int
    size: int
    valid_until: float   # time.monotonic() past which it is renewed before use
    arena: Any           # the client's arena mapping it was lent in (a restarted daemon lends in another)


class CreditWriter:
    """The one credit a connection holds, and the put that uses it."""

    def __init__(self, conn: ConnectionPort, enabled: bool = True) -> None:
        self._conn = conn   # the connection that owns this writer: what it sends through and writes into
        self.enabled = enabled
        self.held: HeldCredit | None = None
        self._lock = threading.RLock()
        self.queued: tuple[int, float] | None = None   # (request id, sent at) of the put whose reply is unread
        self.committed = 0                             # what queued puts committed, until take_result
        self.error: KVStoreError | None = None         # the first error a queued put met, until take_result
        self._refused_need = 0          # a credit this big (or bigger) was refused ...
        self._refused_until = 0.0       # ... until then: such puts go straight to reserve + commit

    def forget(self) -> None:
        """A new session (the daemon restarted, or the client said hello again): the daemon holds no credit."""
        self.held = None

    def put(self, packed: bytes, buffers: Sequence[Any], sizes: list[int],
            parent: bytes | None, wait: bool = True, extra: dict[str, Any] | None = None) -> int | None:
        """Chunks committed through the credit (``wait=False``: queued, see ``settle``), or None: put them with
        reserve + commit instead. ``packed``: the keys end to end, one per buffer."""
        conn = self._conn
        align = int(conn.server_info.get("align") or 0)
        if not self.enabled or not align:
            return None
        starts, need = _layout(sizes, align)
        if need > int(conn.server_info.get("credit_max") or 0) or not self._lock.acquire(blocking=False):
            return None
        try:
            self.settle()   # a queued put's reply names the credit
            if _all_stored(conn, packed):
                return None   # reserve + commit copies nothing for stored keys (and touches them)
            credit = self._usable(need)
            if credit is None:
                return None
            if not daemon_still_serving(conn):
                self.held = None   # its lender is gone: the next daemon may adopt the arena and lend this space
                return None
            view, pages = conn.mapped.arena_view, conn.mapped.pages
            assert view is not None   # a usable credit is one lent in the arena mapped now
            if pages is not None:
                pages.touch(credit.offset, need)
            at = credit.offset
            copy_batch(copy_into, [(view[at + start:at + start + size], buf)
                                   for start, size, buf in zip(starts, sizes, buffers)], sizes)
            sent = time.monotonic()
            self.held = None   # spent: until a reply names the next one (a lost reply must not leave it usable)
            request = {"op": Op.CREDIT_PUT, "credit": credit.id, "keys": packed,
                       "offsets": [credit.offset + s for s in starts], "sizes": sizes, "parent": parent,
                       "want": GROWTH * need, **(extra or {})}
            try:
                if not wait:
                    self.queued = (conn.send(request), sent)
                    return len(sizes)
                header, _ = conn.call(request, retry=False)
            except (ReservationError, VersionError):
                self.held = None   # taken back, or a restarted daemon never lent it: put the other way
                return None
            self._keep(header, sent)
            return int(header["committed"])
        finally:
            self._lock.release()

    def settle(self, wait: bool = False) -> None:
        """Read the reply of the put queued last (``wait=False``), if any, and keep the credit it names. What it
        committed is added to ``committed``; an error is kept in ``error`` (``Client.flush`` raises it).

        Args:
            wait: also wait for a put another thread of the client is making now, and settle it if it queued
                (``flush``, ``close``); else return at once when nothing is queued."""
        if self.queued is None and not wait:
            return   # the common case, without the lock (a put of another thread may hold it)
        with self._lock:
            queued, self.queued = self.queued, None
            if queued is None:
                return
            rid, sent = queued
            try:
                header = self._conn.reply(rid)
            except KVStoreError as exc:
                self.held = None   # whatever the daemon did with the credit, the reply naming it is gone
                self.error = self.error or exc
                return
            self.committed += int(header["committed"])
            self._keep(header, sent)

    def take_result(self) -> int:
        """The chunks the queued puts committed since the last call; raises the first error one of them met."""
        committed, error, self.committed, self.error = self.committed, self.error, 0, None
        if error is not None:
            raise error
        return committed

    def offer(self) -> HeldCredit | None:
        """The held credit, for a reserve to name (the daemon frees it should the room be short, and tries again):
        forgotten until ``offer_done`` hears it was kept, and no other thread of the client uses the credit
        meanwhile (its lock stays held). None when none is held or another thread is writing into it."""
        if self.held is None or not self._lock.acquire(blocking=False):
            return None
        held, self.held = self.held, None
        if held is None or held.arena is not self._conn.mapped.arena:
            self._lock.release()
            return None
        return held

    def offer_done(self, offered: HeldCredit | None, reply: dict[str, Any] | None) -> None:
        """The reserve that named ``offered`` is over: keep the credit when its reply says the daemon kept it
        (after an error it may be gone: the daemon frees a credit its writer no longer names)."""
        if offered is None:
            return
        try:
            if reply is not None and reply.get("credit") == offered.id and offered.arena is self._conn.mapped.arena:
                self.held = offered
        finally:
            self._lock.release()

    def _usable(self, need: int) -> HeldCredit | None:
        """The held credit when it takes ``need`` bytes and is fresh, else one asked for now (or None)."""
        held = self.held
        if held is not None and held.arena is not self._conn.mapped.arena:
            held = self.held = None
        if held is not None and held.size >= need and time.monotonic() < held.valid_until:
            return held
        now = time.monotonic()
        if need >= self._refused_need and now < self._refused_until:
            return None
        self.held = None   # the daemon may move it: until the reply says where it is
        try:
            header, _ = self._conn.call({"op": Op.CREDIT_PUT, "credit": held.id if held else 0, "keys": b"",
                                         "want": GROWTH * need})
        except ReservationError:
            self.held = None
            return None
        self._keep(header, now)
        if self.held is None or self.held.size < need:
            self._refused_need, self._refused_until = need, now + REFUSED_BACKOFF_S
            return None
        return self.held

    def _keep(self, header: dict[str, Any], sent: float) -> None:
        cid = int(header.get("credit") or 0)
        self.held = None if not cid else HeldCredit(
            cid, int(header["offset"]), int(header["size"]), sent + RENEW_AT * float(header["ttl"]),
            self._conn.mapped.arena)


def daemon_still_serving(conn: ConnectionPort) -> bool:
    """Whether the daemon that lent the credit still serves, checked right before bytes are copied into it. A
    restarted daemon may adopt the same arena file (a warm restart) and lend the space again, so a credit from
    before the restart must never be written. Its shared index says so (a stopping daemon marks it CLOSED, and
    the next one marks a killed predecessor's CLOSED before it serves); without one, the stream socket does (a
    dead daemon's end reads as closed); with neither the credit is not used."""
    index = conn.mapped.index
    if index is not None:
        return not index.stale()
    alive = getattr(conn.transport, "alive", None)
    return bool(alive is not None and alive())


def _all_stored(conn: ConnectionPort, packed: bytes) -> bool:
    """Whether the daemon's shared index lists every key (a put of them all would copy for nothing)."""
    index = conn.mapped.index
    return index is not None and index.lists_all(packed)


def _layout(sizes: Sequence[int], align: int) -> tuple[list[int], int]:
    """Each chunk's start from the credit's start (aligned, in order) and the bytes all of them take."""
    starts, at = [], 0
    for size in sizes:
        starts.append(at)
        at += -(-size // align) * align
    return starts, at
