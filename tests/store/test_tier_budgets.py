"""Tenants' budgets in every tier the Store holds them (DRAM, disk, GPU): a property test over the whole Store, and
the disk tier's cases one by one (its ceiling, its guarantee, its charges rebuilt at start)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from kvstore.errors import StoreFullError
from kvstore.sim.movers import InstantDiskMover
from kvstore.store.entry import DiskState, Entry
from kvstore.store.store import Store
from kvstore.store.tenant_budgets import CHARGE_OF, HELD_TIERS
from kvstore.tenants import parse_tenants
from kvstore.tiers.host.tier import HostTier
from kvstore.store.ledgers.builder import tier_ledgers
from kvstore.tiers.virtual import VirtualArena, VirtualDisk

from support.store_machine import KEYS, OWNERS, PAGE, StoreMachine

TENANTS = parse_tenants({
    "a": {"namespaces": ["a:"], "dram": {"guaranteed": 6 * PAGE, "ceiling": 14 * PAGE},
          "disk": {"guaranteed": 10 * PAGE, "ceiling": 24 * PAGE}, "gpu": {"guaranteed": 3 * PAGE}},
    "b": {"namespaces": ["b:"], "dram": {"guaranteed": 3 * PAGE}, "disk": {"ceiling": 12 * PAGE},
          "gpu": {"ceiling": 4 * PAGE}},
    "default": {"disk": {"guaranteed": 4 * PAGE}}}, "t.toml")
NAMESPACES = ["a:x", "b:x", "c:x"]
UNCHECKED = None   # the last step may have lowered any tenant's use (a delete, a failed copy, an expiry)


class TenantStoreMachine(StoreMachine):
    """The Store machine with three tenants (two budgeted in every tier, and ``default``): after every step that
    takes room for a tenant (a put, a disk write, a promotion, a demotion, a watermark round), no other tenant
    holds less in any tier than the lesser of what it held and its guarantee; after every step, no tenant holds
    more than its ceiling in any tier, and every tier's use is the sum of its chunks' charges."""

    def __init__(self) -> None:
        super().__init__()
        self.actors: set[str] | None = UNCHECKED
        self.before: dict[str, dict[str, int]] = {}

    @precondition(lambda self: self.store is None)
    @rule(policy=st.sampled_from(["chain-lru", "s3-fifo"]), host_pages=st.integers(8, 24),
          gpu_pages=st.sampled_from([0, 8]), disk_pages=st.sampled_from([0, 16, 40]), deferred=st.booleans())
    def start(self, policy: str, host_pages: int, gpu_pages: int, disk_pages: int, deferred: bool) -> None:
        self.build_store(policy, host_pages, gpu_pages, disk_pages, summed=False, remote=False, deferred=deferred,
                         tenants=TENANTS)

    # -- the steps that take room for one tenant ------------------------------------------------------------------
    @precondition(StoreMachine.ready)
    @rule(namespace=st.sampled_from(NAMESPACES), first=st.integers(0, len(KEYS) - 1), length=st.integers(1, 4),
          pages=st.integers(1, 2), then_write=st.booleans())
    def put(self, namespace: str, first: int, length: int, pages: int, then_write: bool) -> None:
        self._for(self.store.budgets.name_of(namespace))
        keys = KEYS[first:first + length]
        try:
            handle, _ = self.store.reserve(OWNERS[0], namespace, keys, [pages * PAGE] * len(keys),
                                           KEYS[first - 1] if first else None)
        except StoreFullError:
            return
        self.store.commit(OWNERS[0], handle.id)
        self.store.puts.settle_after_reply()
        if then_write:
            self.check_others()
            self.write_back()

    @precondition(StoreMachine.ready)
    @rule(owner=st.sampled_from(OWNERS), namespace=st.sampled_from(NAMESPACES),
          first=st.integers(0, len(KEYS) - 1), length=st.integers(1, 5), pages=st.integers(1, 3))
    def reserve(self, owner: bytes, namespace: str, first: int, length: int, pages: int) -> None:
        self._for(self.store.budgets.name_of(namespace))
        keys = KEYS[first:first + length]
        try:
            handle, _ = self.store.reserve(owner, namespace, keys, [pages * PAGE - 100] * len(keys),
                                           KEYS[first - 1] if first else None)
        except StoreFullError:
            return
        self.reservations.append((owner, handle.id))

    @precondition(lambda self: self.ready() and self.store.disk is not None)
    @rule()
    def write_back(self) -> None:
        """Every queued write, each one checked as a step of its own tenant."""
        while self.disk is not None:
            self.check_others()
            entry = self._next_write()
            if entry is None:
                return
            self.disk.finish_write(entry, entry.size, None)

    @precondition(lambda self: self.ready() and self.store.disk is not None)
    @rule()
    def start_write(self) -> None:
        entry = self._next_write()
        if entry is not None:
            self.writes.append(entry)

    def _next_write(self) -> Entry | None:
        head = next((e for e in self.disk.dirty if e.disk is DiskState.QUEUED and e.host_offset is not None
                     and self.store.index.get(e.key) is e), None)   # the one next_write takes
        self._for(head.tenant if head is not None else None)
        write = self.disk.next_write()
        return write.chunk if write is not None else None

    @precondition(lambda self: self.ready() and self.store.disk is not None)
    @rule(first=st.integers(0, len(KEYS) - 1), length=st.integers(1, 6))
    def start_promote(self, first: int, length: int) -> None:
        for entry in self.disk.to_promote(KEYS[first:first + length]):
            self.check_others()
            self._for(entry.tenant)
            if self.disk.start_promote(entry) is None:
                break
            self.promotions.append(entry)

    @precondition(lambda self: self.ready() and self.gpu is not None and self.gpu.wanted)
    @rule()
    def promote_wanted(self) -> None:
        for entry in self.gpu.promotions(len(self.gpu.wanted)):
            self.check_others()
            self._for(entry.tenant)
            if self.gpu.start_promote(entry) is not None:
                self.gpu.finish_promote(entry, True)

    @precondition(lambda self: self.ready() and self.gpu is not None)
    @rule(to_host=st.booleans())
    def start_gpu_demote(self, to_host: bool) -> None:
        victim = self.gpu.victim()
        self._for(victim.tenant if victim is not None else None)
        super().start_gpu_demote(to_host)

    @precondition(StoreMachine.ready)
    @rule()
    def rebalance(self) -> None:
        self._for(None)   # the watermark round takes room for nobody: every guarantee stands
        super().rebalance()

    def _for(self, tenant: str | None) -> None:
        """The step acts for ``tenant`` (None: for no tenant); what every tenant holds now is the reference."""
        self.actors = {tenant} if tenant is not None else set()
        self.before = self.uses()

    # -- invariants ---------------------------------------------------------------------------------------------
    def uses(self) -> dict[str, dict[str, int]]:
        return {tier: dict(guard.use) for tier, guard in self.store.budgets.guards.items()}

    def check_others(self) -> None:
        """No tenant but the step's own lost more than its excess over its guarantee in any tier."""
        if self.actors is UNCHECKED or self.store is None:
            return
        after = self.uses()
        for tenant in TENANTS.all():
            if tenant.name in self.actors:
                continue
            for tier in HELD_TIERS:
                guaranteed = tenant.budget(tier).guaranteed_bytes
                held = self.before[tier].get(tenant.name, 0)
                assert after[tier].get(tenant.name, 0) >= min(held, guaranteed), \
                    f"tenant {tenant.name} lost guaranteed {tier} bytes to {self.actors or 'a watermark round'}"

    @invariant()
    def budgets_hold(self) -> None:
        if self.store is None:
            return
        self.store.puts.settle_after_reply()
        self.check_others()
        self.actors = UNCHECKED
        budgets = self.store.budgets
        for entry in self.store.index.values():
            self.seen[id(entry)] = entry
        for tier, guard in budgets.guards.items():
            charged: dict[str, int] = {}
            for entry in self.seen.values():
                charged[entry.tenant] = charged.get(entry.tenant, 0) + CHARGE_OF[tier](entry)
            for tenant in TENANTS.all():
                used = guard.use.get(tenant.name, 0)
                assert used == charged.get(tenant.name, 0), f"{tier} use of {tenant.name} is not its chunks' sum"
                ceiling = tenant.budget(tier).ceiling_bytes
                assert ceiling is None or used <= ceiling, f"tenant {tenant.name} passed its {tier} ceiling"
            for name, spilled in guard.spilled.items():
                assert guard.spilled_bytes[name] == sum(n for _, n in spilled.values())
                assert guard.spilled_bytes[name] <= max(0, guard.use[name] - guard.guaranteed[name])
                for entry, nbytes in spilled.values():
                    assert entry.tenant == name and nbytes == CHARGE_OF[tier](entry)
                    assert entry in guard.shared


TenantStoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None,
                                                suppress_health_check=[HealthCheck.too_slow], derandomize=True,
                                                database=None)
TestTenantStoreProperties = TenantStoreMachine.TestCase


# -- the disk tier, case by case -------------------------------------------------------------------------------------
CHUNK = 4 * PAGE


def disk_store(table: dict, host_chunks: int = 40, disk_chunks: int = 12) -> Store:
    """A Store whose disk tier writes every commit at once (the simulator's mover)."""
    disk = VirtualDisk(disk_chunks * VirtualDisk(1).footprint(CHUNK))
    store = Store(HostTier(VirtualArena(host_chunks * CHUNK)), 1e9, 1e9, tier_ledgers("chain-lru", disk),
                  clock=lambda: 0.0, tenants=parse_tenants(table, "t.toml"))
    assert store.disk_ledger is not None
    InstantDiskMover(store.disk_ledger)
    return store


def put(store: Store, namespace: str, first: int, count: int) -> None:
    keys = [f"{namespace}{first + i}".encode().ljust(16, b".") for i in range(count)]
    handle, _ = store.reserve(b"w", namespace, keys, [CHUNK] * count, None)
    store.commit(b"w", handle.id)


def on_disk(store: Store, tenant: str) -> int:
    return store.budgets.guards["disk"].use[tenant]


def test_a_disk_guarantee_outlives_another_tenants_flood():
    footprint = VirtualDisk(1).footprint(CHUNK)
    store = disk_store({"a": {"namespaces": ["a:"], "disk": {"guaranteed": 6 * footprint}},
                        "b": {"namespaces": ["b:"]}})
    put(store, "a:", 0, 8)
    put(store, "b:", 0, 30)   # floods the 12-chunk disk many times over
    assert on_disk(store, "a") == 6 * footprint
    assert store.budgets.guards["disk"].evicted_by_others["a"] == 2
    assert on_disk(store, "b") == 6 * footprint


def test_a_disk_ceiling_evicts_the_tenants_own_files_first_and_else_skips_the_write():
    footprint = VirtualDisk(1).footprint(CHUNK)
    store = disk_store({"a": {"namespaces": ["a:"], "disk": {"ceiling": 4 * footprint}},
                       "b": {"namespaces": ["b:"], "disk": {"ceiling": footprint // 2}}})
    put(store, "b:", 0, 3)   # each of b's chunks is bigger than its ceiling: never written, its put still served
    assert on_disk(store, "b") == 0 and store.budgets.guards["disk"].refusals["b"] == 3
    assert store.tier_counters.disk_write_skipped == 3 and store.lookup(
        [f"b:{i}".encode().ljust(16, b".") for i in range(3)]).count == 3
    put(store, "a:", 0, 10)
    assert on_disk(store, "a") == 4 * footprint and store.budgets.guards["disk"].refusals["a"] == 0
    assert store.tier_counters.evictions_disk == 6   # a's own oldest files went for its newest


def test_disk_charges_are_rebuilt_from_each_chunks_namespace():
    footprint = VirtualDisk(1).footprint(CHUNK)
    store = disk_store({"a": {"namespaces": ["a:"], "disk": {"ceiling": 2 * footprint}}})
    ledger = store.disk_ledger
    assert ledger is not None
    for i, namespace in enumerate(["a:", "a:", "c:", "a:"]):   # oldest first, as the rebuild adopts them
        assert ledger.adopt(bytes([i]) * 16, CHUNK, namespace, footprint)
    assert on_disk(store, "a") == 2 * footprint and on_disk(store, "default") == footprint
    assert bytes([0]) * 16 not in store.index   # a's oldest went for its newest: it is held to its ceiling


def test_a_guaranteed_tenant_is_parked_out_of_the_shared_queue():
    """Choosing a victim does not walk the protected chunks: they are not in the queue the victim comes from."""
    table = {"a": {"namespaces": ["a:"], "dram": {"guaranteed": 20 * CHUNK}}, "b": {"namespaces": ["b:"]}}
    store = Store(HostTier(VirtualArena(24 * CHUNK)), 1e9, 1e9, tier_ledgers(), clock=lambda: 0.0,
                  tenants=parse_tenants(table, "t.toml"))
    put(store, "a:", 0, 22)
    guard = store.budgets.guards["dram"]
    assert len(guard.parked["a"]) == 20 and len(guard.shared) == 2
    for i in range(10):
        put(store, "b:", i, 1)
    assert store.budgets.use["a"] == 20 * CHUNK and len(guard.shared) == 4 and guard.evicted_by_others["a"] == 2


def test_a_reload_that_gives_a_guarantee_parks_the_chunks_it_names():
    store = Store(HostTier(VirtualArena(12 * CHUNK)), 1e9, 1e9, tier_ledgers(), clock=lambda: 0.0)
    put(store, "a:", 0, 6)
    put(store, "b:", 0, 6)
    assert not store.budgets.active
    store.set_tenants(parse_tenants({"a": {"namespaces": ["a:"], "dram": {"guaranteed": 6 * CHUNK}}}, "t.toml"))
    assert store.lru is store.budgets.guards["dram"] and len(store.budgets.guards["dram"].parked["a"]) == 6
    for i in range(12):
        put(store, "c:", i, 1)
    assert store.budgets.use["a"] == 6 * CHUNK and store.budgets.use["b"] == 0
