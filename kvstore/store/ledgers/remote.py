"""The remote tier's ledger: the puts a commit asks for (their chunks pinned until the put ends) and the host slots
of chunks fetched from the remote store (RESERVED until ``finish_fetch`` publishes them).

Its mover (``mover.py``) takes the queued puts (``take_puts``), books them against their tenant's remote ceiling
(``book``: ``book.py``), sends them and reports each one's end (``put_done``, which unpins); a fetch gets its
slots from ``start_fetch`` and ends in ``finish_fetch``. Chunks fetched from the remote store are published
without a put back to it (``Puts.admit``, ``puts.py``).
"""

from __future__ import annotations

from typing import Protocol, Sequence

from ...errors import StoreFullError
from ..entry import Entry, State
from .base import AdmitPath, LedgerStore, Mover, TierLedger
from ...tiers.remote.book import RemoteBook


class RemoteStore(LedgerStore, Protocol):
    """What the remote ledger asks of the Store beyond every ledger's (``base.LedgerStore``): the pins that hold a
    put's slots, the slots' bytes, a fetch's reserved slots, and the put path that publishes what it fetched."""

    @property
    def puts(self) -> AdmitPath: ...

    def pin(self, entry: Entry) -> None: ...
    def unpin_chain(self, entries: list[Entry]) -> None: ...
    def read(self, entry: Entry) -> memoryview: ...
    def charge_host(self, entry: Entry) -> None: ...
    def drop_reserved(self, entries: list[Entry]) -> None: ...


class RemoteLedger(TierLedger):
    name = "remote"

    def __init__(self, store: RemoteStore) -> None:
        """The remote puts and fetches of ``store`` (which builds this ledger: ``builder.py``)."""
        self.store = store
        self.outbox: list[list[Entry]] = []   # committed chains waiting for their put, pinned
        self.mover: Mover | None = None      # none: nothing is sent
        self.book = RemoteBook(self._ceiling_of)   # what each tenant with a remote ceiling wrote (``book.py``)

    def _ceiling_of(self, tenant: str) -> int | None:
        """``tenant``'s remote ceiling in the table in force (None: none, or no tenants table)."""
        budgets = self.store.budgets
        owner = budgets.table.get(tenant) if budgets.active else None
        return owner.budget("remote").ceiling_bytes if owner is not None else None

    # -- hooks (ledger.py) -------------------------------------------------------------------------------------
    def on_commit(self, entries: Sequence[Entry]) -> None:
        if self.mover is None:
            return
        entries = [e for e in entries if e.host_offset is not None]
        if not entries:
            return
        for entry in entries:
            self.store.pin(entry)   # before any worker can read the slots
        self.outbox.append(entries)
        self.mover.wake()

    # -- puts ------------------------------------------------------------------------------------------------------
    def take_puts(self) -> list[list[Entry]]:
        puts, self.outbox = self.outbox, []
        return puts

    def put_done(self, entries: Sequence[Entry]) -> None:
        """A put ended (or was never sent): its chunks' slots may move again."""
        self.store.unpin_chain(list(entries))

    def views(self, entries: Sequence[Entry]) -> list[memoryview]:
        return [self.store.read(e) for e in entries]

    # -- fetches ---------------------------------------------------------------------------------------------------
    def readable_prefix(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` are readable now (the fetches a get waits for start past them)."""
        return len(self.store.leading(keys))

    def known(self, key: bytes) -> bool:
        """Whether the index holds ``key`` in any state (stored, or being written or fetched)."""
        return key in self.store.index

    def start_fetch(self, namespace: str, keys: Sequence[bytes], sizes: Sequence[int],
                    parent: bytes | None) -> list[Entry]:
        """Host slots for chunks the remote store holds, in chain order, as RESERVED entries. Stops at a key already
        indexed (stored, or being written or fetched), at a slot that cannot be had without evicting pinned
        chunks, and where the chain would pass half the host tier (it would evict its own prefix)."""
        store = self.store
        budget = store.host.capacity_bytes // 2
        entries: list[Entry] = []
        prev = parent
        for key, size in zip(keys, sizes):
            budget -= size
            if budget < 0 or key in store.index:
                break
            try:
                offset = store.allocate_host(size, namespace=namespace)   # held to its tenant's budget
            except StoreFullError:
                break
            entry = Entry(key, size, namespace, prev, State.RESERVED, host_offset=offset)
            store.charge_host(entry)
            store.index[key] = entry
            entries.append(entry)
            prev = key
        return entries

    def finish_fetch(self, entries: Sequence[Entry], loaded: int, sums: Sequence[int | None] = ()) -> int:
        """The first ``loaded`` entries hold their bytes, checked against the records' ``sums``: publish them with
        those sums (and queue them for the disk); free the rest. Returns how many were published."""
        good = list(entries[:loaded])
        for entry, checksum in zip(good, sums):
            entry.learn_checksum(checksum)
        self.store.puts.admit(good, source=self)
        self.store.drop_reserved(list(entries[loaded:]))
        tc = self.store.tier_counters
        tc.promotions_remote_host += len(good)
        tc.promoted_bytes_remote_host += sum(e.size for e in good)
        return len(good)
