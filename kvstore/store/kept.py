"""What a restart keeps of the DRAM tier, on the Store's side: ``KeptCopies``, the collaborator the Store owns for
it (``Store.kept``).

While the daemon runs, every DRAM copy that holds final bytes and a known checksum is told to the host tier's
journal (``journal_commits``; ``tiers/host/journal.py``), so that what a crash leaves can be proved. At the next
start, the chunks of the kept arena that ``adoption.py`` verified are published again (``adopt``), those that
failed are freed with every chain they start (``drop_unverified``), and the key parameters their records carry are
learnt (``learn_params``) before a client's hello is checked against them (``server/requests/compat.py``).

``KeptCopies`` owns the leases that shield chunks a reader held across the restart (issued to ``KEPT_READERS``,
an owner no client has) and is given only what it uses of the Store (``KeptStore``, which the Store fits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from ..protocol.key_params import KeyParams
from ..protocol.retention import Retention
from ..tiers.host.description import KeptChunk
from .entry import Entry, State
from .retention import stored_class

if TYPE_CHECKING:
    from .classes import RetentionClasses
    from .eviction import EvictionQueue
    from .handles import HandleTable
    from ..tiers.host.tier import HostTier

KEPT_READERS = b"\0kept-readers"   # the owner of the leases that shield chunks read across a restart


class Continuations(Protocol):
    """What the warm restart asks of the damage path (``damage.Damage``): drop the chains a lost chunk starts."""

    def drop_continuations(self, keys: set[bytes]) -> int: ...


class KeptStore(Protocol):
    """What the warm restart uses of the Store: the index and DRAM, its queue, leases and pins, the classes, the
    damage path and the key parameters of each namespace."""

    @property
    def index(self) -> dict[bytes, Entry]: ...
    @property
    def host(self) -> HostTier: ...
    @property
    def lru(self) -> EvictionQueue: ...
    @property
    def leases(self) -> HandleTable[list[Entry]]: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def key_params(self) -> dict[str, KeyParams]: ...
    @property
    def retention(self) -> RetentionClasses: ...
    @property
    def damage(self) -> Continuations: ...

    def charge_host(self, entry: Entry) -> None: ...
    def sync_many(self, keys: Sequence[bytes]) -> None: ...
    def pin(self, entry: Entry) -> None: ...


class KeptCopies:
    """The Store's side of a warm restart (see the module docstring)."""

    def __init__(self, store: KeptStore) -> None:
        self.store = store

    def adopt(self, chunks: Sequence[KeptChunk], hold_for: float = 0.0) -> tuple[list[Entry], int]:
        """Publish chunks of a kept arena whose bytes were just verified (their slots taken already:
        ``HostTier.adopt``), oldest first. A key the disk tier holds gets the slot as its DRAM copy; a key held
        in DRAM already (put again meanwhile) keeps its own, and the kept slot is freed. Chunks a reader leased
        at the stop stay pinned for ``hold_for`` seconds (a lease of no client), so that a reader from before the
        restart never sees their slot reused within a lease's life. Each chunk comes back in the retention class
        its record keeps (a pin as ``high``), or its disk file's where that is higher. Returns (the entries
        published, how many kept slots were freed as duplicates)."""
        store = self.store
        published: list[Entry] = []
        held: list[Entry] = []
        duplicates = 0
        if any(chunk.retention is not Retention.NORMAL for chunk in chunks):
            store.retention.split_queues()   # before any is queued: each goes to its class's queue
        for chunk in chunks:
            self.learn_params(chunk.namespace, chunk.params)
            entry = store.index.get(chunk.key)
            if entry is None:
                entry = Entry(chunk.key, chunk.size, chunk.namespace, chunk.parent, State.COMMITTED,
                              host_offset=chunk.offset, checksum=chunk.checksum, engine=chunk.engine,
                              retention=chunk.retention)
                store.index[chunk.key] = entry
            elif entry.readable and entry.host_offset is None and entry.loading is None and entry.size == chunk.size:
                entry.host_offset = chunk.offset
                entry.learn_checksum(chunk.checksum)
                if chunk.retention > entry.retention:   # the disk file's class, or the kept record's: the higher
                    store.retention.raise_to(entry, chunk.retention)
            else:
                store.host.free(chunk.offset)
                duplicates += 1
                continue
            store.charge_host(entry)
            published.append(entry)
            if chunk.leased and hold_for > 0:
                held.append(entry)
        store.sync_many([e.key for e in published])
        self.journal_commits(published)
        shielded = {id(e) for e in held}
        store.lru.add_chain([e for e in published if id(e) not in shielded])
        if held:
            for entry in held:
                store.pin(entry)
            store.leases.issue(KEPT_READERS, held, hold_for, store.clock())
        return published, duplicates

    def learn_params(self, namespace: str, params: KeyParams | None) -> None:
        """A record found at start says how ``namespace``'s clients made its chunk's keys: the first such record
        of a namespace names them (all of a namespace's held chunks share them: ``server/requests/compat.py``)."""
        if params is not None:
            self.store.key_params.setdefault(namespace, params)

    def drop_unverified(self, chunks: Sequence[KeptChunk]) -> int:
        """Free the kept slots of chunks that failed verification and drop every published chunk that continues
        one of them (a chain is unreachable past a missing link). Returns how many published chunks went."""
        for chunk in chunks:
            self.store.host.free(chunk.offset)
        return self.store.damage.drop_continuations({c.key for c in chunks})

    def journal_commits(self, entries: Sequence[Entry]) -> None:
        """Tell the host tier's journal (what a crash leaves: ``tiers/host/journal.py``) that ``entries`` hold
        their DRAM slots with final bytes; those whose checksum is not known yet are left out."""
        journal = self.store.host.journal
        if journal is not None:
            params = self.store.key_params.get
            journal.committed([kept_chunk(e, e.checksum, params=params(e.namespace)) for e in entries
                               if e.host_offset is not None and e.checksum is not None])


def kept_chunk(entry: Entry, checksum: int, leased: bool = False, params: KeyParams | None = None) -> KeptChunk:
    """``entry``'s DRAM copy as a kept arena's record names it (``entry.host_offset`` is set), its class a pin's
    ``high`` (``retention.stored_class``), with its namespace's key parameters ``params`` when known."""
    assert entry.host_offset is not None
    return KeptChunk(entry.key, entry.host_offset, entry.size, entry.namespace, entry.parent, checksum, leased,
                     entry.engine, stored_class(entry), params)
