"""Lookups: how many leading keys are stored, read from the daemon's shared index where it can answer, else asked
over the socket (one request, or a pipelined batch of them).

Owns the choice between the index and the socket for ``Client.lookup``, ``lookup_many`` and ``lookup_tiers``,
and the note a lookup answered from the index leaves for the daemon (``mapped/index_reader.py`` SeenNotes: told
in the next request's write, or at once when one is due). The keys come packed end to end, checked by the
caller. May call: the connection (its request path, transport, mappings, notes and credit), the index reader.
"""

from __future__ import annotations

from ..errors import DaemonUnavailable, VersionError
from ..keys import KEY_BYTES
from ..mapped.index_reader import tiers_of
from ..protocol.wire import Op
from .connection import Connection
from .lease import LookupResult
from .transport_base import ConnectionLost


def local(conn: Connection, packed: bytes, promote: bool) -> tuple[int, list[int], bytes] | None:
    """The shared index's answer (leading keys stored, count per state, those keys packed), or None: ask the
    socket."""
    conn.credit.settle()   # a lookup sees this client's queued puts
    index = conn.mapped.index
    if index is None or not conn.transport.alive():
        return None
    answer = index.answer(packed, promote)
    if answer is not None and conn.seen.add_packed(len(packed) // KEY_BYTES, answer[2]):
        conn.tell_seen()   # now: what watches the daemon sees a lookup even if this client idles
    return answer


def count(conn: Connection, packed: bytes) -> int:
    """How many leading keys of ``packed`` are stored, in any tier (promoting those below DRAM)."""
    if not packed:
        return 0
    found = local(conn, packed, True)
    return found[0] if found is not None else asked(conn, packed, True).count


def tiers(conn: Connection, packed: bytes, promote: bool) -> LookupResult:
    """How many leading keys of ``packed`` are stored and how many of those each tier holds."""
    if not packed:
        return LookupResult(0, {})
    found = local(conn, packed, promote)
    if found is not None:
        return LookupResult(found[0], tiers_of(found[1]))
    return asked(conn, packed, promote)


def asked(conn: Connection, packed: bytes, promote: bool) -> LookupResult:
    """The socket's answer to a lookup of ``packed`` (after the shared index could not give one)."""
    header, _ = conn.request({"op": Op.LOOKUP, "keys": packed, "promote": promote})
    return LookupResult(int(header["count"]), dict(header.get("tiers", {})))


def many(conn: Connection, chains: list[bytes]) -> list[int]:
    """``count`` of each chain: from the shared index where it answers, else in one round trip (the requests
    are pipelined), once more after a hello should the daemon have restarted meanwhile."""
    if conn.mapped.index is not None and conn.transport.alive():
        return [count(conn, keys) for keys in chains]
    try:
        return _pipelined(conn, chains)
    except (VersionError, ConnectionLost):
        conn.hello()  # the daemon restarted and forgot us
        return _pipelined(conn, chains)


def _pipelined(conn: Connection, chains: list[bytes]) -> list[int]:
    conn.credit.settle()
    if conn.seen:
        conn.tell_seen(hold=True)
    ids = [conn.transport.send({"op": Op.LOOKUP, "keys": keys, "promote": True}) if keys else 0
           for keys in chains]
    counts, error = [], None
    for rid in ids:  # every reply is waited for (or given up on), so none is left behind when one fails
        try:
            wait: float | None = 0.0 if isinstance(error, DaemonUnavailable) else None
            counts.append(int(conn.transport.wait(rid, wait)[0]["count"]) if rid else 0)
        except Exception as exc:  # noqa: BLE001 - re-raised below, once the others are in
            error = error or exc
            counts.append(0)
    if error is not None:
        raise error
    return counts
