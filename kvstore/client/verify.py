"""Client-side verification of what a get hands out (``Client.get(keys, verify=True)``).

The daemon sends each chunk's checksum with the lease; the client hashes the bytes it was given (the zero-copy
view into the shared arena, or the received frame) and keeps only the leading run that matches. A chunk that
fails, or whose sum is not known yet, ends the prefix there (a prefix ends at its first miss anyway); failures
are reported to the daemon (``CORRUPT``), which checks the chunk itself and repairs or drops it.

Cost: one xxh3-64 pass over the bytes read, on the reader's thread (``bench/verify.py`` measures it against an
unverified get). Off by default: the daemon's own checks at every tier move and its scrubs cover chunks at rest;
this covers the last step, the bytes a reader is about to use.
"""

from __future__ import annotations

from typing import Any, Sequence

import xxhash

from ..protocol.wire import Op
from .port import ConnectionPort


def _bytes_of(view: Any) -> Any:
    if isinstance(view, memoryview):
        return view
    return memoryview(view).cast("B")


def verified_prefix(views: Sequence[Any], sums: Sequence[int | None]) -> tuple[int, list[int]]:
    """How many leading ``views`` match their ``sums``, and the indices of those that failed (not unknown)."""
    good = len(views)
    failed: list[int] = []
    for i, (view, expected) in enumerate(zip(views, sums)):
        if expected is None:
            good = min(good, i)
            break
        if xxhash.xxh3_64_intdigest(_bytes_of(view)) != expected:
            failed.append(i)
            good = min(good, i)
            break
    if len(sums) < len(views):
        good = min(good, len(sums))
    return good, failed


def verified_lease(conn: ConnectionPort, lease: Any, keys: list[bytes], sums: list[int | None]) -> Any:
    """Cut ``lease`` (a ``client/lease.py`` Lease) to its verified prefix, reporting the chunks that failed."""
    good, failed = verified_prefix(lease.views, sums)
    if failed:
        conn.request({"op": Op.CORRUPT, "keys": [keys[i] for i in failed]})
    for view in lease.views[good:]:
        if isinstance(view, memoryview):
            view.release()
    lease.views, lease.tiers = lease.views[:good], lease.tiers[:good]
    return lease
