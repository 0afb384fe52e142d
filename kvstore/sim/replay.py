"""Trace replay through the daemon's own Store: which tier would have served each request's prefix.

The simulated daemon is the real ``Store`` (index, extent allocator, eviction policy) with the daemon's own
ledgers (``store/ledgers/disk.py``, ``store/ledgers/gpu.py``: write-back queue, demotion watermarks, promotion
budget, promotion on repeated hits) over payload-less tiers (``tiers/virtual.py``). Only the movers are
replaced, by movers whose transfers complete at once (``movers.py``): the figures assume the disk and the GPU
copies keep up. Reads map the GPU pool (an engine on the daemon's GPU).

Per request, as an engine's connector would: look the chain up (which touches it and reports the tier of each
leading chunk), promote the disk-only chunks, take and release a lease on them (as a load would), then put the
rest. Token hit rate is Σ min(block_tokens × leading cached blocks, input_length) / Σ input_length, split by the
tier each leading block was found in (the partial last block counts against the tier of the last block hit).
A put that cannot fit (one request larger than the host tier) is counted and skipped, as the daemon would
refuse it.

Cost: a handful of dict operations per block per step, so a trace of a few hundred thousand blocks (Mooncake's
conversation trace) replays in seconds.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

from ..errors import StoreFullError
from ..store.policies import DEFAULT_POLICY
from ..store.store import Store
from ..tenants.table import TenantTable
from ..store.ledgers.builder import tier_ledgers
from ..tiers.virtual import VirtualDisk, virtual_gpu_tier, virtual_host_tier
from .movers import InstantDiskMover, InstantGpuMover
from .trace import BLOCK_TOKENS, Request

OWNER = b"simulator"
NAMESPACE = "trace"
TTL = 1e9   # leases and reservations never expire during a replay


@dataclass(frozen=True)
class Capacity:
    """Tier sizes in bytes (0: no disk tier) and the bytes of one chunk."""

    host_bytes: int
    disk_bytes: int
    chunk_bytes: int
    gpu_bytes: int = 0


@dataclass
class ReplayResult:
    policy: str
    capacity: Capacity
    requests: int = 0
    input_tokens: int = 0
    hit_tokens: dict[str, int] = field(default_factory=lambda: {"host": 0, "disk": 0})  # + "gpu" with a GPU tier
    put_failures: int = 0
    evictions: int = 0          # chunks that left the cache entirely
    demotions: int = 0          # host → disk
    promotions: int = 0         # disk → host
    seconds: float = 0.0
    tenants: dict[str, dict[str, int]] = field(default_factory=dict)   # name -> input_tokens, hit_tokens, ...

    def hit_rate(self, tier: str | None = None) -> float:
        hit = sum(self.hit_tokens.values()) if tier is None else self.hit_tokens.get(tier, 0)
        return hit / self.input_tokens if self.input_tokens else 0.0

    def to_json(self) -> dict:
        data = asdict(self)
        data["hit_rate"] = {tier: round(self.hit_rate(tier), 5) for tier in self.hit_tokens}
        data["hit_rate"]["total"] = round(self.hit_rate(), 5)
        data["seconds"] = round(self.seconds, 2)
        for tenant in data["tenants"].values():
            tenant["hit_rate"] = round(tenant["hit_tokens"] / tenant["input_tokens"], 5) if tenant["input_tokens"] \
                else 0.0
        return data


def block_key(block_id: int) -> bytes:
    return block_id.to_bytes(8, "little", signed=True)


class SimulatedStore:
    """A Store over payload-less tiers, its ledgers driven by movers that finish every transfer at once."""

    def __init__(self, capacity: Capacity, policy: str = DEFAULT_POLICY, tenants: TenantTable | None = None) -> None:
        self.chunk_bytes = capacity.chunk_bytes
        disk = VirtualDisk(capacity.disk_bytes) if capacity.disk_bytes else None
        # The GPU tier's accounting is an extent allocator with a capacity, like the host tier's.
        gpu = virtual_gpu_tier(capacity.gpu_bytes) if capacity.gpu_bytes else None
        self.store = Store(virtual_host_tier(capacity.host_bytes), TTL, TTL, tier_ledgers(policy, disk, gpu),
                           clock=lambda: 0.0, tenants=by_name(tenants) if tenants is not None else None)
        store = self.store
        self.disk = InstantDiskMover(store.disk_ledger) if store.disk_ledger is not None else None
        self.gpu = InstantGpuMover(store.gpu_ledger) if store.gpu_ledger is not None else None
        self.put_failures = 0

    # -- one request -----------------------------------------------------------------------------------------
    def cached(self, keys: Sequence[bytes]) -> int:
        """Leading keys held in any tier, touching nothing (what a router asks)."""
        return len(self.store.leading(keys))

    def serve(self, keys: Sequence[bytes], namespace: str = NAMESPACE) -> list[str]:
        """Look up, load and then store one request's chain; returns the tier each leading hit came from."""
        store = self.store
        found = store.lookup(keys)
        if self.disk is not None:
            self.disk.promote(self.disk.ledger.to_promote(keys))   # as the daemon's lookup and get do
        if found.count:
            lease, _ = store.get(OWNER, keys[:found.count], gpu_ok=self.gpu is not None)
            if lease is not None:
                store.release(OWNER, lease.id)
        rest = keys[found.count:]
        if rest:
            parent = keys[found.count - 1] if found.count else None
            try:
                handle, _ = store.reserve(OWNER, namespace, rest, [self.chunk_bytes] * len(rest), parent)
            except StoreFullError:
                self.put_failures += 1
            else:
                store.commit(OWNER, handle.id)
        if self.gpu is not None:
            self.gpu.settle()
        return found.tiers


def hit_tokens_by_tier(tiers: list[str], input_length: int, block_tokens: int = BLOCK_TOKENS) -> Counter:
    """Tokens served from each tier: whole blocks, the overshoot of a partial last block taken off its tier."""
    counts: Counter = Counter()
    if not tiers:
        return counts
    for tier in tiers:
        counts[tier] += block_tokens
    counts[tiers[-1]] -= len(tiers) * block_tokens - min(len(tiers) * block_tokens, input_length)
    return counts


def by_name(table: TenantTable) -> TenantTable:
    """The table with each tenant owning the namespace ``NAME:`` (a trace names the tenant of each request)."""
    return TenantTable(tuple(replace(t, namespaces=(t.name + ":",)) for t in table.tenants), table.default,
                       table.source)


def tenant_namespace(request: Request, table: TenantTable | None) -> str:
    if not request.tenant:
        return NAMESPACE
    known = table is not None and any(t.name == request.tenant for t in table.tenants)
    return request.tenant + ":" if known else f"{NAMESPACE}/{request.tenant}"


def replay(requests: Sequence[Request], capacity: Capacity, policy: str = DEFAULT_POLICY,
           block_tokens: int = BLOCK_TOKENS, tenants: TenantTable | None = None) -> ReplayResult:
    """Serve every request in order through one simulated daemon; with ``tenants``, each request's tenant (the
    trace's ``tenant`` field) is held to its budgets and its hit rate reported apart."""
    started = time.perf_counter()
    sim = SimulatedStore(capacity, policy, tenants)
    result = ReplayResult(policy, capacity)
    hits: Counter = Counter()
    for request in requests:
        namespace = tenant_namespace(request, tenants)
        prefix = namespace.encode()
        keys = [prefix + block_key(b) for b in request.hash_ids] if request.tenant else \
            [block_key(b) for b in request.hash_ids]
        served = hit_tokens_by_tier(sim.serve(keys, namespace), request.input_length, block_tokens)
        hits.update(served)
        result.input_tokens += request.input_length
        if tenants is not None or request.tenant:
            owner = sim.store.budgets.tenant_of(namespace).name
            _count_tenant(result, request.tenant if tenants is None else owner, request, sum(served.values()))
    result.requests = len(requests)
    result.hit_tokens = {"host": hits["host"], "disk": hits["disk"]}
    if capacity.gpu_bytes:
        result.hit_tokens = {"gpu": hits["gpu"], **result.hit_tokens}
    result.put_failures = sim.put_failures
    result.evictions = sim.store.counters.evictions
    result.demotions = sim.store.tier_counters.demotions_host_disk
    result.promotions = sim.store.tier_counters.promotions_disk_host
    result.seconds = time.perf_counter() - started
    for name, row in sim.store.budgets.stats().items():
        if name in result.tenants:
            result.tenants[name]["evicted_by_others"] = int(row["evicted_by_others"] or 0)
            result.tenants[name]["ceiling_refusals"] = int(row["ceiling_refusals"] or 0)
    return result


def _count_tenant(result: ReplayResult, tenant: str, request: Request, hit: int) -> None:
    row = result.tenants.setdefault(tenant, {"requests": 0, "input_tokens": 0, "hit_tokens": 0})
    row["requests"] += 1
    row["input_tokens"] += request.input_length
    row["hit_tokens"] += hit


def unbounded(requests: Sequence[Request], chunk_bytes: int, block_tokens: int = BLOCK_TOKENS) -> ReplayResult:
    """The ceiling: a host tier large enough for every distinct block, so nothing is ever evicted."""
    blocks = len({b for r in requests for b in r.hash_ids})
    slot = -(-chunk_bytes // 4096) * 4096
    return replay(requests, Capacity(max(blocks, 1) * slot, 0, chunk_bytes), block_tokens=block_tokens)
