"""The Store state machine the property tests drive: the Store as the daemon wires it over payload-less tiers,
its ledgers' movers played by the machine, and every accounting invariant checked after each step (see
``tests/store/test_store_properties.py``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import hypothesis.strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstore.errors import ChecksumError, DamagedSource, LeaseError, ReservationError, StoreFullError
from kvstore.protocol.index_layout import STATE_OF_TIER
from kvstore.protocol.retention import parse_retention
from kvstore.store.after_reply import AfterReply
from kvstore.store.entry import DiskState, Entry, State
from kvstore.store.policies import POLICIES
from kvstore.store.publishing import top_tier
from kvstore.store.store import Store
from kvstore.tiers.host.tier import HostTier
from kvstore.store.ledgers.builder import tier_ledgers
from kvstore.tiers.virtual import VirtualArena, VirtualDisk

PAGE = 4096
KEYS = [bytes([i]) * 16 for i in range(12)]
OWNERS = [b"a", b"b"]
TTL = 10.0
CLASSES = ["normal", "normal", "low", "high", "pin"]   # a put's retention class (normal the most common)


class Published:
    """The shared index as the Store sees it: key → state, and key → the DRAM copy's (offset, size) it lists."""

    def __init__(self) -> None:
        self.states: dict[bytes, int] = {}
        self.hosts: dict[bytes, tuple[int | None, int]] = {}

    def set(self, key: bytes, state: int, host: int | None = None, size: int = 0) -> None:
        self.states[key] = state
        self.hosts[key] = (host, size)

    def set_many(self, items) -> None:
        for key, state, host, size in items:
            self.set(key, state, host, size)

    def remove(self, key: bytes) -> None:
        self.states.pop(key, None)
        self.hosts.pop(key, None)


class Movers:
    """The disk, GPU and remote movers, reduced to what their ledgers wake them for."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.wakes = 0
        self.removed: list[bytes] = []
        self.remote_puts: list[list[Entry]] = []

    def wake(self) -> None:
        self.wakes += 1
        self.remote_puts += self.store.remote_ledger.take_puts()   # as the remote mover sends them

    def remove_file(self, key: bytes, quarantine: str | None = None) -> None:
        self.removed.append(key)


class Sums:
    def __init__(self) -> None:
        self.pending: list[list[Entry]] = []

    def after_commit(self, entries: list[Entry]) -> None:
        self.pending.append(list(entries))


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.store: Store | None = None
        self.seen: dict[int, Entry] = {}
        self.reservations: list[tuple[bytes, int]] = []
        self.leases: list[tuple[bytes, int, list[Entry], list[str]]] = []
        self.writes: list[Entry] = []
        self.promotions: list[Entry] = []
        self.gpu_promotions: list[Entry] = []
        self.gpu_demotions: list[Entry] = []
        self.fetches: list[list[Entry]] = []

    # -- set-up ------------------------------------------------------------------------------------------
    @precondition(lambda self: self.store is None)
    @rule(policy=st.sampled_from(sorted(POLICIES)), host_pages=st.integers(6, 24),
          gpu_pages=st.sampled_from([0, 4, 10]), disk_pages=st.sampled_from([0, 8, 30]),
          summed=st.booleans(), remote=st.booleans(), deferred=st.booleans())
    def start(self, policy: str, host_pages: int, gpu_pages: int, disk_pages: int, summed: bool,
              remote: bool, deferred: bool) -> None:
        self.build_store(policy, host_pages, gpu_pages, disk_pages, summed, remote, deferred)

    def build_store(self, policy: str, host_pages: int, gpu_pages: int, disk_pages: int, summed: bool,
                    remote: bool, deferred: bool, **store_args: Any) -> None:
        """A Store of these tiers wired to the machine's movers, sums and shared index (``store_args``: more of
        the Store's keyword arguments, e.g. ``tenants``)."""
        disk = VirtualDisk(disk_pages * PAGE) if disk_pages else None
        gpu = HostTier(VirtualArena(gpu_pages * PAGE)) if gpu_pages else None
        store = Store(HostTier(VirtualArena(host_pages * PAGE)), TTL, TTL, tier_ledgers(policy, disk, gpu),
                      clock=lambda: self.now, **store_args)
        self.wiring = Movers(store)
        self.sums = Sums()
        self.published = Published()
        for ledger in (store.disk_ledger, store.gpu_ledger):
            if ledger is not None:
                ledger.mover = self.wiring
        store.remote_ledger.mover = self.wiring if remote else None
        store.publishing.published = self.published
        store.puts.sums = self.sums if summed else None
        store.after_reply = AfterReply() if deferred else None   # as the daemon: a commit's rest after its reply
        self.store = store
        self.disk = store.disk_ledger
        self.gpu = store.gpu_ledger
        self.remote = store.remote_ledger

    def ready(self) -> bool:
        return self.store is not None

    # -- puts ----------------------------------------------------------------------------------------------
    @precondition(ready)
    @rule(owner=st.sampled_from(OWNERS), first=st.integers(0, len(KEYS) - 1), length=st.integers(1, 5),
          pages=st.lists(st.integers(1, 3), min_size=5, max_size=5))
    def reserve(self, owner: bytes, first: int, length: int, pages: list[int]) -> None:
        keys = KEYS[first:first + length]
        parent = KEYS[first - 1] if first else None
        sizes = [p * PAGE - 100 for p in pages[:len(keys)]]
        try:
            handle, _ = self.store.reserve(owner, "ns", keys, sizes, parent)
        except StoreFullError:
            return
        self.reservations.append((owner, handle.id))

    @precondition(ready)
    @rule(first=st.integers(0, len(KEYS) - 1), length=st.integers(1, 4), pages=st.integers(1, 2),
          then_write=st.booleans(), retention=st.sampled_from(CLASSES))
    def put(self, first: int, length: int, pages: int, then_write: bool, retention: str = "normal") -> None:
        """A whole put (reserve, then commit at once): the common case, so chunks pile up and tiers fill. Its
        retention class moves the chunks it stores again between every tier's class queues
        (``RetentionClasses.reclass``)."""
        keys = KEYS[first:first + length]
        try:
            handle, _ = self.store.reserve(OWNERS[0], "ns", keys, [pages * PAGE] * len(keys),
                                           KEYS[first - 1] if first else None,
                                           retention=parse_retention(retention, 5.0 if retention == "pin" else None))
        except StoreFullError:
            return
        self.store.commit(OWNERS[0], handle.id)
        if then_write:
            self.write_back()

    @precondition(lambda self: self.reservations)
    @rule(pick=st.integers(0, 100), commit=st.booleans())
    def finish_put(self, pick: int, commit: bool) -> None:
        owner, rid = self.reservations.pop(pick % len(self.reservations))
        try:
            (self.store.commit if commit else self.store.abort)(owner, rid)
        except ReservationError:
            pass   # expired meanwhile

    @precondition(lambda self: self.ready() and self.sums.pending)
    @rule()
    def checksummed(self) -> None:
        entries = self.sums.pending.pop(0)
        for entry in entries:
            entry.checksum = 1
        self.store.puts.checksummed(entries)

    # -- gets ----------------------------------------------------------------------------------------------
    @precondition(ready)
    @rule(owner=st.sampled_from(OWNERS), first=st.integers(0, len(KEYS) - 1), length=st.integers(1, 8),
          gpu_ok=st.booleans())
    def get(self, owner: bytes, first: int, length: int, gpu_ok: bool) -> None:
        self.store.lookup(KEYS[first:first + length])
        handle, entries = self.store.get(owner, KEYS[first:first + length], gpu_ok=gpu_ok)
        if handle is not None:
            self.leases.append((owner, handle.id, entries, [top_tier(e) for e in entries]))

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(0, 100))
    def release(self, pick: int) -> None:
        owner, lid, _, _ = self.leases.pop(pick % len(self.leases))
        try:
            self.store.release(owner, lid)
        except LeaseError:
            pass

    # -- removal and time ------------------------------------------------------------------------------------
    @precondition(ready)
    @rule(first=st.integers(0, len(KEYS) - 1), length=st.integers(1, 4))
    def delete(self, first: int, length: int) -> None:
        self.store.delete(KEYS[first:first + length])

    @precondition(ready)
    @rule(seconds=st.sampled_from([1.0, TTL + 1]))
    def expire(self, seconds: float) -> None:
        self.now += seconds
        self.store.expire()
        live = {h.id for h in self.store.leases}
        self.leases = [lease for lease in self.leases if lease[1] in live]
        live = {h.id for h in self.store.puts.reservations}
        self.reservations = [r for r in self.reservations if r[1] in live]

    @precondition(ready)
    @rule(owner=st.sampled_from(OWNERS))
    def drop_owner(self, owner: bytes) -> None:
        self.store.drop_owner(owner)
        self.leases = [lease for lease in self.leases if lease[0] != owner]
        self.reservations = [r for r in self.reservations if r[0] != owner]

    @precondition(ready)
    @rule()
    def rebalance(self) -> None:
        if self.disk is not None:
            self.disk.rebalance()

    # -- the disk tier's mover ---------------------------------------------------------------------------------
    @precondition(lambda self: self.ready() and self.store.disk is not None)
    @rule()
    def start_write(self) -> None:
        write = self.disk.next_write()
        if write is not None:
            self.writes.append(write.chunk)

    @precondition(lambda self: self.ready() and self.store.disk is not None)
    @rule()
    def write_back(self) -> None:
        """The tier manager drains the write-back queue, every write succeeding (as the simulator does)."""
        if self.disk is None:
            return
        write = self.disk.next_write()
        while write is not None:
            self.disk.finish_write(write.chunk, write.chunk.size, None)
            write = self.disk.next_write()

    @precondition(lambda self: self.writes)
    @rule(pick=st.integers(0, 100), outcome=st.sampled_from(["ok", "ok", "io", "damaged"]))
    def finish_write(self, pick: int, outcome: str) -> None:
        entry = self.writes.pop(pick % len(self.writes))
        error = {"ok": None, "io": OSError(5, "I/O error"), "damaged": DamagedSource("slot failed")}[outcome]
        self.disk.finish_write(entry, entry.size if error is None else None, error)

    @precondition(lambda self: self.ready() and self.store.disk is not None)
    @rule(first=st.integers(0, len(KEYS) - 1), length=st.integers(1, 6), pick=st.integers(0, 100))
    def start_promote(self, first: int, length: int, pick: int) -> None:
        """Promote a request's disk-only prefix (or, half the time, a chain from a disk-only chunk on)."""
        keys = KEYS[first:first + length]
        disk_only = [e.key for e in self.store.index.values() if e.host_offset is None and e.readable]
        if disk_only and pick % 2:
            start = KEYS.index(disk_only[pick % len(disk_only)])
            keys = KEYS[start:start + length]
        for entry in self.disk.to_promote(keys):
            if self.disk.start_promote(entry) is None:
                break
            self.promotions.append(entry)

    @precondition(lambda self: self.promotions)
    @rule(pick=st.integers(0, 100), outcome=st.sampled_from(["ok", "ok", "io", "checksum"]))
    def finish_promote(self, pick: int, outcome: str) -> None:
        entry = self.promotions.pop(pick % len(self.promotions))
        error = {"ok": None, "io": OSError(5, "I/O error"), "checksum": ChecksumError("bad sum")}[outcome]
        self.disk.finish_promote(entry, error, checksum=1)

    # -- the GPU tier's mover ------------------------------------------------------------------------------------
    @precondition(lambda self: self.ready() and self.gpu is not None and self.gpu.wanted)
    @rule(limit=st.integers(1, 3))
    def start_gpu_promote(self, limit: int) -> None:
        for entry in self.gpu.promotions(limit):
            if self.gpu.start_promote(entry) is not None:
                self.gpu_promotions.append(entry)

    @precondition(lambda self: self.ready() and self.gpu is not None and self.gpu.wanted)
    @rule()
    def promote_wanted(self) -> None:
        """The GPU mover's round (the simulator's): every wanted promotion, each copy complete at once."""
        for entry in self.gpu.promotions(len(self.gpu.wanted)):
            if self.gpu.start_promote(entry) is not None:
                self.gpu.finish_promote(entry, True)

    @precondition(lambda self: self.gpu_promotions)
    @rule(pick=st.integers(0, 100), ok=st.booleans())
    def finish_gpu_promote(self, pick: int, ok: bool) -> None:
        self.gpu.finish_promote(self.gpu_promotions.pop(pick % len(self.gpu_promotions)), ok)

    @precondition(lambda self: self.ready() and self.gpu is not None)
    @rule()
    def shed_gpu(self) -> None:
        """The GPU mover's watermark round, each copy down left in flight."""
        self.gpu.shed(self._demote)

    def _demote(self, victim: Entry) -> bool:
        try:
            offset = self.gpu.start_demote(victim)
        except StoreFullError:
            return False
        if offset is not None:
            self.gpu_demotions.append(victim)
        return True

    @precondition(lambda self: self.ready() and self.gpu is not None)
    @rule(to_host=st.booleans())
    def start_gpu_demote(self, to_host: bool) -> None:
        victim = self.gpu.victim()
        if victim is None:
            return
        try:
            offset = self.gpu.start_demote(victim, to_host=to_host)
        except StoreFullError:
            return
        if offset is not None:
            self.gpu_demotions.append(victim)

    @precondition(lambda self: self.gpu_demotions)
    @rule(pick=st.integers(0, 100), ok=st.booleans())
    def finish_gpu_demote(self, pick: int, ok: bool) -> None:
        self.gpu.finish_demote(self.gpu_demotions.pop(pick % len(self.gpu_demotions)), ok)

    # -- the remote tier's mover ------------------------------------------------------------------------------------
    @precondition(lambda self: self.ready() and self.wiring.remote_puts)
    @rule(pick=st.integers(0, 100))
    def finish_remote_put(self, pick: int) -> None:
        self.remote.put_done(self.wiring.remote_puts.pop(pick % len(self.wiring.remote_puts)))

    @precondition(ready)
    @rule(first=st.integers(0, len(KEYS) - 1), length=st.integers(1, 4))
    def start_remote_fetch(self, first: int, length: int) -> None:
        keys = KEYS[first:first + length]
        entries = self.remote.start_fetch("ns", keys, [PAGE] * len(keys), KEYS[first - 1] if first else None)
        if entries:
            self.fetches.append(entries)

    @precondition(lambda self: self.fetches)
    @rule(pick=st.integers(0, 100), loaded=st.integers(0, 4))
    def finish_remote_fetch(self, pick: int, loaded: int) -> None:
        entries = self.fetches.pop(pick % len(self.fetches))
        loaded = min(loaded, len(entries))
        self.remote.finish_fetch(entries, loaded, [1] * loaded)

    # -- invariants ------------------------------------------------------------------------------------------
    @invariant()
    def accounting_holds(self) -> None:
        store = self.store
        if store is None:
            return
        store.puts.settle_after_reply()   # each rule is a request: its reply is out, the work it left is done
        for entry in store.index.values():
            self.seen[id(entry)] = entry
        entries = list(self.seen.values())
        self.check_extents(store.host, [e.host_offset for e in entries] + [e.loading for e in entries])
        if store.gpu is not None:
            self.check_extents(store.gpu, [e.gpu_offset for e in entries] + [e.gpu_loading for e in entries])
        else:
            assert all(e.gpu_offset is None and e.gpu_loading is None for e in entries)
        self.check_disk(entries)
        self.check_queues()
        self.check_intents()
        self.check_leases()
        self.check_published()

    @staticmethod
    def check_extents(tier: HostTier, offsets: list[int | None]) -> None:
        held = Counter(o for o in offsets if o is not None)
        doubled = [o for o, n in held.items() if n > 1]
        assert not doubled, f"extents held twice: {doubled}"
        allocated = tier.allocator._allocated
        assert set(held) == {unit * tier.allocator.align for unit in allocated}, \
            "every allocator extent belongs to exactly one entry field"
        assert tier.used_bytes == tier.allocator.align * sum(allocated.values())

    def check_intents(self) -> None:
        """What the ledgers hold for their movers names live chunks, and the Store holds no mover."""
        store = self.store
        if self.gpu is not None:
            for key, entry in self.gpu.wanted.items():
                assert store.index.get(key) is entry, "a promotion request names a chunk no longer indexed"
        assert not self.remote.outbox, "a queued remote put was not handed to the woken mover"
        assert all(v is not self.wiring for v in vars(store).values()), "the Store holds a mover"

    def check_disk(self, entries: list[Entry]) -> None:
        store = self.store
        if store.disk is None:
            assert all(e.disk is DiskState.NONE for e in entries)
            return
        on_disk = [e for e in entries if e.disk in (DiskState.WRITING, DiskState.STORED)]
        assert store.disk.used_bytes == sum(e.disk_bytes for e in on_disk)
        assert store.disk.used_bytes <= store.disk.capacity_bytes
        assert all(e.disk_bytes == 0 for e in entries if e.disk in (DiskState.NONE, DiskState.QUEUED))
        writing = [e for e in entries if e.disk is DiskState.WRITING]
        assert sorted(map(id, writing)) == sorted(map(id, self.writes))
        for entry in writing:
            assert entry.host_offset is not None, "a chunk being written keeps its DRAM slot"
        assert self.disk.dirty_bytes == sum(e.size for e in self.disk.dirty) + sum(e.size for e in writing)

    def check_queues(self) -> None:
        store = self.store
        for name, queue, holds in (("host", store.lru, lambda e: e.host_offset is not None),
                                   ("gpu", self.gpu.lru if self.gpu else [], lambda e: e.gpu_offset is not None),
                                   ("disk", self.disk.lru if self.disk else [],
                                    lambda e: e.disk is not DiskState.NONE)):
            for entry in queue:
                assert store.index.get(entry.key) is entry, f"{name} queue holds an unindexed chunk"
                assert entry.readable, f"{name} queue holds an unreadable chunk"
                assert holds(entry), f"{name} queue holds a chunk with no copy in that tier"
                if name != "disk":
                    assert entry.pins == 0, f"{name} queue holds a leased chunk"
        for entry in store.index.values():
            if entry.readable and entry.pins == 0 and entry.host_offset is not None:
                assert entry in store.lru, "an evictable DRAM chunk is missing from the host queue"
            if (entry.disk is DiskState.STORED and entry.loading is None) or entry.disk is DiskState.QUEUED:
                assert entry in self.disk.lru, f"a chunk on disk is missing from the disk queue {entry}"

    def check_leases(self) -> None:
        for _, _, entries, tiers in self.leases:
            for entry, tier in zip(entries, tiers):
                assert entry.pins > 0
                held = entry.gpu_offset if tier == "gpu" else entry.host_offset
                assert held is not None, f"a leased chunk lost its {tier} copy"
        pins = Counter()
        for handle in self.store.leases:
            pins.update(id(e) for e in handle.payload)
        for put in self.wiring.remote_puts:
            pins.update(id(e) for e in put)
        for entry in self.seen.values():
            assert entry.pins == pins[id(entry)], "pins = leases + remote puts holding the chunk"

    def check_published(self) -> None:
        store = self.store
        expected = {k: STATE_OF_TIER[top_tier(e)] for k, e in store.index.items() if e.readable}
        assert self.published.states == expected
        # a reader copying out of the arena is pointed at the chunk's DRAM copy as it is now, or at none
        assert self.published.hosts == {k: (e.host_offset, e.size) for k, e in store.index.items() if e.readable}
        for entry in store.index.values():
            if entry.state is State.COMMITTED:
                assert entry.host_offset is not None or entry.gpu_offset is not None \
                    or entry.disk is not DiskState.NONE or entry.doomed, "an indexed chunk with no copy anywhere"
