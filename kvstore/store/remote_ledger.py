"""The remote tier's ledger: the ``Store`` methods the remote mover (``remote_mover.py``) calls: pins held by a
background put, and host slots for chunks fetched from the remote store (RESERVED until ``finish_remote_fetch``
publishes them). A mixin of ``Store``, like ``disk_ledger.py``.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import StoreFullError
from .entry import Entry, State


class RemoteLedger:
    """Methods of ``Store`` for the remote tier (see the module docstring)."""

    def count_remote_hits(self, chunks: int) -> None:
        """A lookup found ``chunks`` more in the remote store (or being fetched from it) past its local walk."""
        self.counters.hit_keys += chunks

    def pin_chain(self, entries: Sequence[Entry]) -> None:
        """Keep committed chunks' slots in place (out of every LRU) until ``unpin_chain``: a remote put reads them."""
        for entry in entries:
            self._pin(entry)

    def unpin_chain(self, entries: Sequence[Entry]) -> None:
        self._unpin_chain(list(entries))

    def start_remote_fetch(self, namespace: str, keys: Sequence[bytes], sizes: Sequence[int],
                           parent: bytes | None) -> list[Entry]:
        """Host slots for chunks the remote store holds, in chain order, as RESERVED entries. Stops at a key already
        indexed (stored, or being written or fetched), at a slot that cannot be had without evicting pinned
        chunks, and where the chain would pass half the host tier (it would evict its own prefix)."""
        budget = self.host.capacity_bytes // 2
        entries: list[Entry] = []
        prev = parent
        for key, size in zip(keys, sizes):
            budget -= size
            if budget < 0 or key in self.index:
                break
            try:
                offset = self._allocate(size)
            except StoreFullError:
                break
            entry = Entry(key, size, namespace, prev, State.RESERVED, host_offset=offset)
            self.index[key] = entry
            entries.append(entry)
            prev = key
        return entries

    def finish_remote_fetch(self, entries: Sequence[Entry], loaded: int,
                            sums: Sequence[int | None] = ()) -> int:
        """The first ``loaded`` entries hold their bytes, checked against the records' ``sums``: publish them with
        those sums (and queue them for the disk); free the rest. Returns how many were published."""
        good = list(entries[:loaded])
        for entry, checksum in zip(good, sums):
            entry.checksum = checksum
        for entry in good:
            entry.state = State.COMMITTED
            self._sync(entry.key)
        self.lru.add_chain(good)
        self._queue_writes(good)
        self._drop_reserved(list(entries[loaded:]))
        tc = self.tier_counters
        tc.promotions_remote_host += len(good)
        tc.promoted_bytes_remote_host += sum(e.size for e in good)
        return len(good)
