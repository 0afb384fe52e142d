"""Writes: how a put's bytes reach the daemon, and the reservations a caller fills itself.

A put takes the first way that applies: nothing but a request for a ``no-store`` put (the daemon counts it); the
bytes inline (``PUT_INLINE``) for a client that maps no arena; one ``CREDIT_PUT`` into the space the daemon lent
(``credit.py``); else reserve → copy → commit. A put made at once where ``wait=False`` asked for a queued one is
counted with the queued ones (``Client.flush``). A reserve names the credit held, so that the daemon may free it
should the room be short.

Owns the choice of way and the reserve + commit of a put. The arguments come checked (``arguments.py``), the keys
packed end to end. May call: the connection (its request path, mappings and credit), ``lease.py``'s
reservations, the copies.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..protocol.wire import Op
from .buffers import copy_into
from .connection import Connection
from .copies import copy_batch
from .lease import InlineReservation, Reservation


def put(conn: Connection, packed: bytes, buffers: Sequence[Any], converted: list[Any], parent: bytes | None,
        extra: dict[str, Any], wait: bool, stores: bool, inline: bool) -> int | None:
    """Put the chunks ``buffers`` under the keys ``packed`` (``Client.put``): ``converted`` is each buffer's
    bytes where ``inline`` (a client that maps no arena), else its size. Returns the chunks written, or None where
    ``wait`` is False. Raises what the daemon replies (StoreFullError, ...)."""
    if not stores:   # one request, no bytes: the daemon acknowledges and counts it
        return _not_waited(conn, put_inline(conn, packed, [], parent, extra), wait)
    if inline:
        return _not_waited(conn, put_inline(conn, packed, converted, parent, extra), wait)
    committed = conn.credit.put(packed, buffers, converted, parent, wait, extra)
    if committed is not None:
        return committed if wait else None
    return _not_waited(conn, _put_reserved(conn, packed, buffers, converted, parent, extra), wait)


def _not_waited(conn: Connection, committed: int, wait: bool) -> int | None:
    """A put that could not be queued was made at once: ``flush`` counts it with the queued ones."""
    if wait:
        return committed
    conn.credit.committed += committed
    return None


def _put_reserved(conn: Connection, packed: bytes, buffers: Sequence[Any], sizes: list[int],
                  parent: bytes | None, extra: dict[str, Any] | None = None) -> int:
    reservation = reserve(conn, packed, sizes, parent, extra)
    try:
        todo = [(view, buf) for view, buf in zip(reservation.views, buffers) if view is not None]
        copy_batch(copy_into, todo, [view.nbytes for view, _ in todo])
    except BaseException:
        reservation.abort()
        raise
    return reservation.commit()


def put_inline(conn: Connection, packed: bytes, payloads: list[Any], parent: bytes | None,
               extra: dict[str, Any] | None = None) -> int:
    """Send the chunks' bytes in the request (``PUT_INLINE``); the chunks written."""
    header, _ = conn.request({"op": Op.PUT_INLINE, "keys": packed, "parent": parent, **(extra or {})}, payloads)
    return int(header["committed"])


def reserve_inline(conn: Connection, packed: bytes, sizes: list[int], parent: bytes | None,
                   extra: dict[str, Any], stores: bool) -> Reservation:
    """A reservation for a local client the daemon offers no arena: buffers of its own, sent at the commit."""
    request = {"op": Op.PUT_INLINE, "keys": packed, "parent": parent, **extra}
    return InlineReservation(conn, request, sizes, stores)


def reserve(conn: Connection, packed: bytes, sizes: list[int], parent: bytes | None,
            extra: dict[str, Any] | None = None) -> Reservation:
    """Reserve arena slots of ``sizes`` bytes for the keys ``packed`` (``Client.reserve``); raises what the daemon
    replies (StoreFullError, ...)."""
    offered = conn.credit.offer()   # the space lent to us may be what is missing: the daemon frees it then
    request = {"op": Op.RESERVE, "keys": packed, "sizes": sizes, "parent": parent,
               "credit": offered.id if offered else 0, **(extra or {})}
    header = None
    try:
        header, _ = conn.request(request)
    finally:
        conn.credit.offer_done(offered, header)
    views: list[memoryview | None] = []
    arena, pages = conn.mapped.arena_view, conn.mapped.pages
    for slot in header["slots"]:   # the writer's own slots: of the read-write mapping
        if slot is None:
            views.append(None)
            continue
        assert arena is not None, "slots are given only to a client that maps the arena"
        if pages is not None:
            pages.touch(slot[0], slot[1])
        views.append(arena[slot[0]:slot[0] + slot[1]])
    return Reservation(conn, int(header["reservation"]), views)
