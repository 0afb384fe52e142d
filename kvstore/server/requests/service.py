"""The service: everything a request handler may touch, and the tier orchestration requests need.

The daemon (``lifecycle/daemon.py``) keeps the sockets and the life cycle, and its dispatcher
(``lifecycle/dispatcher.py``) the sessions and dispatch; it builds one ``Service`` at start-up and hands it to
every handler (``handlers.py``, ``integrity_handlers.py``). Handlers import this module, never the daemon, so
the server package has no import cycle, and a handler cannot reach a socket or a session table. Decisions that
span tiers (which tier to promote from for a lookup, what a get waits for before it pins) are made here, in one
place, rather than in each handler; the Store's own fields stay behind its methods.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ... import logs
from ...config import ServerConfig
from ...store.events import EventLog
from ...tenants.access import private_namespaces
from ...tenants.key_file import open_tenant_keys
from ...tenants.key_space import SessionKeys, TenantKeys
from ...tiers.gpu.mover import GpuMover
from ...tiers.disk.mover import DiskMover
from ...mapped.index_writer import PublishedIndex
from ...tiers.remote.mover import RemoteMover
from ...store.store import LookupResult, Store
from ...tenants.table import DEFAULT_TENANT
from ...store.adoption import Adoption
from ..events.publisher import EventPublisher
from .safeguards import Safeguards
from .session import Session
from .load_costs import LoadCosts

if TYPE_CHECKING:
    from ...tenants.table import TenantTable
    from .reload import ReloadReport


@dataclass
class ServiceCounters:
    lookup_tokens: int = 0
    hit_tokens: int = 0
    requests: int = 0
    errors: int = 0


@dataclass
class TenantTokens:
    """One tenant's lookups, in tokens: asked and found (its sessions' namespaces decide the tenant)."""

    lookup_tokens: int = 0
    hit_tokens: int = 0


@dataclass
class Tiers:
    """What start-up opened for the service (``tier_setup.open_tiers``): the Store, the movers of the tiers below
    DRAM, and what publishes and watches them."""

    store: Store
    safeguards: Safeguards                          # checksums, scrubs, verification, key parameters
    disk_mover: DiskMover | None = None             # the disk tier's mover
    gpu_mover: GpuMover | None = None
    gpu_hello: dict[str, Any] | None = None         # the HELLO reply's "gpu" field (exported once)
    remote: RemoteMover | None = None
    index: PublishedIndex | None = None             # the lookup index clients read in shared memory
    events: EventPublisher | None = None            # KV cache events (--events-endpoint), and their log
    event_log: EventLog | None = None
    adoption: Adoption | None = None                # the kept arena's verification (store/adoption.py)


class Service:
    def __init__(self, config: ServerConfig, tiers: Tiers, tenants: "TenantTable | None" = None,
                 stats: Callable[[], dict[str, Any]] = dict,
                 stream_path: Callable[[], str | None] = lambda: None,
                 reload: Callable[[], "ReloadReport"] | None = None,
                 tenant_keys: TenantKeys | None = None) -> None:
        """What handlers may touch, complete from the start.

        Args:
            config: the daemon's settings.
            tiers: what start-up opened (``tier_setup.open_tiers``).
            tenants: the config file's tenants table; None: one shared tenant.
            stats: the daemon's ``stats`` reply.
            stream_path: the listening stream socket's path, if any.
            reload: reads the config file's tenants table again and applies it (``reload.py``); None: no file.
            tenant_keys: the restricted tenants' key spaces (``tenants/key_file.py``); None: ``tenants`` has no
                restricted tenant.
        """
        self.config = config
        self.started = time.time()
        self.counters = ServiceCounters()
        self.store = tiers.store
        self.disk_mover = tiers.disk_mover
        self.gpu_mover = tiers.gpu_mover
        self.gpu_hello = tiers.gpu_hello
        self.remote = tiers.remote
        self.safeguards = tiers.safeguards
        self.index = tiers.index
        self.events = tiers.events
        self.event_log = tiers.event_log
        self.adoption = tiers.adoption
        self.stream_path = stream_path
        self.stats = stats
        self.tenants = tenants
        self.tenant_keys = tenant_keys
        self.tenant_tokens: dict[str, TenantTokens] = {}   # by tenant name (names come from the config file)
        self.reload = reload
        self.load_costs = LoadCosts()   # what the clients' own loads cost, as they report them

    # -- tenants --------------------------------------------------------------------------------------------
    def capacities(self) -> dict[str, int | None]:
        """Each tier's size in force, which the tenants' guarantees must fit (``check_capacities``)."""
        disk = self.store.disk
        return {"dram": self.store.host.capacity_bytes, "disk": disk.capacity_bytes if disk is not None else 0,
                "gpu": self.config.gpu_mem}

    def set_tenants(self, table: "TenantTable") -> None:
        """Apply a reloaded tenants table at once: the access checks, every tier's budgets, which namespaces the
        shared index keeps out (a namespace that became restricted is unlisted, one that became open listed), and
        the key spaces sessions send their keys in (``key_space``).

        Raises:
            ConfigError: the table is the first with a restricted tenant and the tenant key file cannot be made
                or trusted (nothing is applied).
        """
        if self.tenant_keys is None:
            self.tenant_keys = open_tenant_keys(self.config, table)
        self.tenants = table
        self.store.set_tenants(table)
        self.store.publishing.set_private(private_namespaces(table))

    def key_space(self, session: Session) -> SessionKeys:
        """What ``session``'s keys are mapped through (``tenants/key_space.py``): its tenant's key space when the
        tenant is restricted, then its namespace's binding (``binding.py``). Chosen at its hello, and again at its
        first request under a reloaded table. A namespace whose space changes leaves its chunks under the old keys,
        misses for its sessions from then on."""
        if session.key_space is None or session.key_space_table is not self.tenants:
            keys = self.tenant_keys
            space = keys.space_for(self.tenants, session.namespace) if keys is not None else None
            session.key_space = SessionKeys(session.namespace, space)
            session.key_space_table = self.tenants
        return session.key_space

    def movers(self) -> list[Any]:
        """The movers of the tiers below DRAM (``tiers/mover_life.py``), in start order."""
        return [m for m in (self.disk_mover, self.remote, self.gpu_mover) if m is not None]

    # -- lookups --------------------------------------------------------------------------------------------
    def count_lookup_tokens(self, session: Session, asked: int, found: int) -> None:
        self.counters.lookup_tokens += asked * session.chunk_tokens
        self.counters.hit_tokens += found * session.chunk_tokens
        if self.tenants is not None and self.tenants.configured:
            name = self.tenants.tenant_for(session.namespace).name
            tokens = self.tenant_tokens.get(name)
            if tokens is None:
                tokens = self.tenant_tokens[name] = TenantTokens()
            tokens.lookup_tokens += asked * session.chunk_tokens
            tokens.hit_tokens += found * session.chunk_tokens

    def tenant_stats(self) -> dict[str, dict[str, Any]]:
        """Per tenant of the table in force: its use of every tier against its budget (``tenant_budgets.py``) and
        its lookups' tokens asked and found (``lookup_tokens``, ``hit_tokens``)."""
        out = self.store.budgets.stats()
        for name, row in out.items():
            tokens = self.tenant_tokens.get(name, TenantTokens())
            row.update(lookup_tokens=tokens.lookup_tokens, hit_tokens=tokens.hit_tokens)
            if self.remote is not None:
                row["tiers"]["remote"] = self._remote_tenant(name)
        return out

    def _remote_tenant(self, name: str) -> dict[str, Any]:
        """Tenant ``name``'s row of the remote tier: the bytes this daemon wrote for it and has not deleted or seen
        missing (``tiers/remote/book.py``), its budget, and the puts not sent at its ceiling."""
        booked = self.store.remote_ledger.book.stats(name)
        tenant = self.store.budgets.table.get(name)
        budget = tenant.budget("remote") if tenant is not None else None
        return {"bytes": booked["bytes"], "guaranteed": budget.guaranteed_bytes if budget is not None else 0,
                "ceiling": budget.ceiling_bytes if budget is not None else None, "evicted_by_others": 0,
                "ceiling_refusals": booked["ceiling_refusals"], "deleted_for_ceiling": booked["deleted_for_ceiling"],
                "seen_missing": booked["seen_missing"]}

    def promote_after_lookup(self, keys: Sequence[bytes], result: LookupResult) -> None:
        """A lookup that found disk-only chunks starts reading them into DRAM, so the get that follows hits."""
        ledger = self.store.disk_ledger
        if self.disk_mover is not None and ledger is not None and "disk" in result.tiers:
            self.disk_mover.promote(ledger.to_promote(keys))

    # -- puts -----------------------------------------------------------------------------------------------
    def write_back_behind(self, nbytes: int) -> bool:
        """Whether a put of ``nbytes`` must wait for write-back to catch up (back-pressure)."""
        return self.disk_mover is not None and self.disk_mover.over_bound(nbytes)

    async def wait_for_write_back(self, nbytes: int, seconds: float) -> bool:
        assert self.disk_mover is not None
        return await self.disk_mover.wait_for_room(nbytes, seconds)

    # -- gets -----------------------------------------------------------------------------------------------
    def arrivals(self, keys: Sequence[bytes], gpu_ok: bool, verify: bool, wait: bool) -> list[asyncio.Future]:
        """What a get of ``keys`` waits for before it pins: checksums being taken (for a verifying reader), and
        when the reader may wait, reads from disk, copies down from the GPU tier (for a reader that cannot map
        it) and fetches from the remote store. Starts the reads and copies it asks for."""
        waits: list[asyncio.Future] = self.safeguards.integrity.waits(keys) if verify else []
        if wait:
            disk, gpu = self.store.disk_ledger, self.store.gpu_ledger
            if self.disk_mover is not None and disk is not None:
                on_disk = disk.to_promote(keys)
                if on_disk:
                    waits += self.disk_mover.promote(on_disk)
            if self.gpu_mover is not None and gpu is not None and not gpu_ok:
                waits += self.gpu_mover.fetch_down(gpu.only_here(keys))
            if self.remote is not None:
                waits += self.remote.pending(keys)   # chunks a lookup found in the remote store, still arriving
        # Every one, finished or not: a read whose result has come back is applied (the chunk given its DRAM slot)
        # by a done-callback that runs on a later turn of the loop, and until it has, the chunk still looks
        # disk-only. Awaiting a finished future yields to those callbacks first (they were queued before ours).
        return waits

    # -- engines --------------------------------------------------------------------------------------------
    def engine_joined(self, session: Session) -> None:
        """A session opened: when it named its engine, KV cache events are published for that engine from now on
        (``event_topics.py``)."""
        if self.events is not None and session.identity is not None:
            tenant = self.tenants.tenant_for(session.namespace).name if self.tenants is not None else DEFAULT_TENANT
            self.events.engine_joined(session.namespace, session.identity, tenant)

    def engine_left(self, session: Session) -> None:
        """A session closed: the last one of its engine ends that engine's events."""
        if self.events is not None and session.identity is not None:
            self.events.engine_left(session.namespace, session.identity)

    # -- the stop -------------------------------------------------------------------------------------------
    async def drain_movers(self, deadline: Callable[[str], float]) -> None:
        """At stop: the GPU mover's copies and the remote puts by the "remote" step's deadline, the write-back
        queue by the "disk" step's (``stopping.py``; ``deadline(step)`` is on ``time.monotonic``). Sums being taken
        come first: the write-back and remote put of a fresh chunk start from its sum."""
        summed = await self.safeguards.integrity.drain(deadline("remote"))
        logs.info("sums_drained", complete=summed)
        if self.gpu_mover is not None:
            done = await self.gpu_mover.drain(deadline("remote"))
            logs.info("gpu_drained", complete=done)
        if self.remote is not None:
            sent = await self.remote.drain(deadline("remote"))
            logs.info("remote_drained", complete=sent)
        if self.disk_mover is not None:
            started = time.monotonic()
            queued = self.disk_mover.queued_bytes()
            flushed = await self.disk_mover.drain(deadline("disk"))
            logs.info("disk_flushed", complete=flushed, bytes=queued, seconds=round(time.monotonic() - started, 3))
