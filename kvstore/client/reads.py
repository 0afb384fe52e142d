"""Reads: a get's lease made from the daemon's reply, and the reads that need no lease.

A leased get hands out views: over ipc:// windows on the read-only mapping of the arena (``mappings.py``), or of
the GPU pool for chunks the GPU tier holds (a client that maps it); over tcp:// (or a client the daemon offers no
arena) the received frames, read-only. With ``verify`` the lease is cut to the run that matches its checksums
(``verify.py``). ``get_into`` and ``read`` first try the arena without a round trip (``arena_read.py``), the
daemon told in the next note, and lease the chunks only when the index cannot answer.

Views handed to callers never let them change what other readers get: they are read-only memoryviews, and over
``ipc://`` they are windows on a read-only mapping of the arena (``mappings.py``), so even a tensor made from one
(torch does not honour the flag) cannot write into the stored chunk.

Owns the lease's views and the copies out of them. The keys come packed end to end, checked by the caller. May
call: the connection (its request path, mappings, notes and credit), ``arena_read.py``, ``lease.py``,
``verify.py``, the copies.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

from ..errors import UsageError
from ..keys import KEY_BYTES
from ..protocol.wire import Op
from .buffers import copy_out, nbytes_of
from .connection import Connection
from .copies import copy_batch
from .lease import Lease


def leased(conn: Connection, keys: Sequence[bytes], packed: bytes, verify: bool) -> Lease:
    """Lease the longest stored prefix of ``keys`` (``Client.get``); raises what the daemon replies."""
    if not keys:
        return Lease(conn, 0, [])
    sent, m = time.monotonic(), conn.mapped
    header, payload = conn.request({"op": Op.GET, "keys": packed, "inline": m.read_view is None,
                                    "gpu": m.gpu_pool is not None and not verify, "verify": verify})
    slots = header["slots"]
    arena, pool = m.read_view, m.gpu_pool
    if arena is None:
        lease = Lease(conn, 0, [_frame_view(frame) for frame in payload])
    else:
        assert m.read_pages is not None   # mapped with the read view
        tiers = header.get("tiers") or ["host"] * len(slots)
        for (off, size), tier in zip(slots, tiers):
            if tier != "gpu" or pool is None:
                m.read_pages.touch(off, size)
        views = [pool.view(off, size) if tier == "gpu" and pool is not None
                 else arena[off:off + size] for (off, size), tier in zip(slots, tiers)]
        lease = Lease(conn, int(header["lease"]), views, list(tiers), sent + float(header.get("ttl", math.inf)))
    if not verify:
        return lease
    from .verify import verified_lease

    return verified_lease(conn, lease, list(keys), header.get("sums", []))


def _frame_view(frame: Any) -> memoryview:
    """A read-only view of one received payload: a ZeroMQ frame's buffer, or the stream socket's bytes."""
    return (frame.buffer if hasattr(frame, "buffer") else memoryview(frame)).toreadonly()


def copy_views(views: Sequence[Any], outs: Sequence[Any]) -> int:
    """Copy leased ``views`` into ``outs`` (``writable_bytes`` of the caller's destinations, one per view); how
    many were copied. Raises UsageError for a destination smaller than its chunk."""
    pairs, sizes = [], []
    for i, (view, out) in enumerate(zip(views, outs)):
        if nbytes_of(out) < nbytes_of(view):
            raise UsageError(f"get_into: destination {i} holds {nbytes_of(out)} bytes; its chunk has "
                             f"{nbytes_of(view)}")
        pairs.append((out, view if isinstance(view, memoryview) else memoryview(view.cpu().numpy())))
        sizes.append(pairs[-1][1].nbytes)
    copy_batch(copy_out, pairs, sizes)
    return len(views)


def from_arena(conn: Connection, read: Callable[..., int | None], packed: bytes, target: Any) -> int | None:
    """A read straight from the arena through the daemon's index (``arena_read.py``: ``read_into`` or
    ``read_with``, into ``target``), told to the daemon in the next note; the chunks read, or None: lease them."""
    conn.credit.settle()   # a read sees this client's queued puts
    m = conn.mapped
    if m.index is None or m.read_view is None or not conn.transport.alive():
        return None
    count = read(m.index, m.read_view, m.read_pages, packed, target)
    if count is None:
        return None
    if count and conn.seen.add_read(packed[:KEY_BYTES * count]):
        conn.tell_seen()
    return count
