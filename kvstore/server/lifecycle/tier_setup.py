"""Opening the tiers below the host arena at start-up: disk, GPU and remote, each onto the daemon's claims.

Each opener either returns a working tier or raises ``ConfigError`` with one line, and registers on ``Claims``
(``startup.py``) everything it took, so that a later failure or the normal stop releases it in the right
order: the GPU tier unpins the arena before the arena goes, the remote backend's workers stop before it is
unmapped, the disk directory's lock goes after everything that writes there. The disk directory is locked
before it is read (a second daemon must not see, let alone rebuild, another daemon's files) and before the
host arena is created, so a directory in use is refused without taking any memory.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable

from ... import logs
from ...config import ServerConfig
from ...errors import ConfigError
from ...security.redact import redact_url
from ...units import format_size
from ...store.after_reply import AfterReply
from ...store.ledgers.disk import DiskLedger
from ...store.events import EventLog
from ...tiers.gpu.mover import GpuMover
from ...tiers.disk.mover import DiskMover
from ...tiers.remote.mover import RemoteMover
from ...store.store import PinSettings, Store
from ...store.ledgers.builder import tier_ledgers
from ...mapped.arena import SharedArena, arena_path_for
from ...tiers.disk.tier import DiskTier, disk_room
from ...tiers.host.tier import HostTier
from ...store.adoption import Adoption, KeptArena
from ...tenants.access import private_namespaces
from ..events.publisher import EventPublisher, EventSettings
from .local_access import open_index
from ..requests.safeguards import Safeguards
from ..requests.service import Tiers
from .startup import Claims, exclusive_lock

if TYPE_CHECKING:
    from ...tenants.table import TenantTable

REMOTE_NAMESPACE = "kvstore"   # store-wide: chunk keys already commit to each client's namespace
REMOTE_TIMEOUT = 1.0           # deadline of a remote metadata call (data calls add bytes / 256 MiB/s)
REMOTE_RETRY = 1.0             # while the remote store is down, probe it at most this often
REMOTE_MAX_PENDING = 1 << 30   # bytes of background puts in flight (and pinned), at most a quarter of DRAM


def open_disk(config: ServerConfig, claims: Claims) -> DiskTier | None:
    """The disk tier, its directory created (0700 at every level made) and locked before it is read."""
    if not config.disk_enabled:
        return None
    directory = os.path.abspath(config.disk_dir)
    claims.private_dirs(directory, "--disk-dir")
    claims.hold(exclusive_lock(os.path.join(directory, ".lock"), f"--disk-dir: another kvstore daemon uses "
                               f"{directory}; give each daemon its own --disk-dir", "--disk-dir"))
    return DiskTier(directory, disk_capacity(config.disk_size, directory), compress=config.disk_compression == "lz4")


def disk_capacity(requested: int, directory: str) -> int:
    """The disk tier's cap: ``requested`` (-1: auto) checked against what the filesystem can hold for the tier
    (free space plus the tier's own files, less headroom: ``tiers/disk/tier.py``), logged with what was assumed.
    Raises ConfigError when a set size cannot fit."""
    room = disk_room(directory)
    size = requested if requested > 0 else room.auto_size()
    figures = (f"{format_size(room.free)} free + {format_size(room.held)} of the tier's own files - "
               f"{format_size(room.headroom)} kept for directories and file overheads")
    if size > room.usable:
        raise ConfigError(f"--disk-size: {format_size(size)} does not fit the filesystem of {directory}, which can "
                          f"give the tier {format_size(room.usable)} ({figures}); give at most "
                          f"{room.usable >> 20}MiB, or auto")
    logs.info("disk_sized", directory=directory, requested="auto" if requested < 0 else requested,
              capacity_bytes=size, usable_bytes=room.usable, free_bytes=room.free, held_bytes=room.held,
              headroom_bytes=room.headroom)
    return size


def open_tiers(config: ServerConfig, tenants: "TenantTable | None", host: HostTier, disk: DiskTier | None,
               arena: SharedArena, claims: Claims, remote_close_wait: Callable[[], float],
               kept: KeptArena | None = None) -> Tiers:
    """The Store over the host arena and the tiers below it, each tier's mover on its ledger, and the safeguards,
    each closer onto ``claims``.

    Args:
        tenants: the config file's tenants table (their budgets must fit the tiers), or None.
        remote_close_wait: the seconds the stop leaves the remote backend to close, asked at the stop.
        kept: what the arena kept from the last daemon, adopted once the disk index is rebuilt, so that a kept
            chunk with a disk copy becomes that copy's DRAM copy.

    Returns:
        What the service is built with. Raises ConfigError when a tier cannot be opened.
    """
    take = claims.take
    gpu = open_gpu(config, arena, claims)
    if tenants is not None:
        from ...tenants.table import check_capacities

        check_capacities(tenants, {"dram": host.capacity_bytes, "disk": disk.capacity_bytes if disk else 0,
                                   "gpu": config.gpu_mem})
    index = open_index(config, claims)
    # Events before the disk index is rebuilt: what survived is announced after the clear.
    publisher, event_log = open_events(config, claims)
    store = Store(host, config.lease_ttl, config.reserve_ttl, tier_ledgers(config.eviction_policy, disk, gpu),
                  tenants=tenants, after_reply=AfterReply(),   # a put's reply goes out before the work no reader sees
                  private=private_namespaces(tenants), events=event_log, published=index,
                  pins=PinSettings(config.pin_ttl, config.max_pin_ttl, config.max_pin_share))
    if index is not None:
        take(store.publishing.stop_publishing)   # released before the index closes
    gpu_mover, gpu_hello = None, None
    if store.gpu_ledger is not None and gpu is not None:
        gpu_mover = GpuMover(store.gpu_ledger, host)
        take(gpu_mover.close)   # waits for copies in flight: before the GPU pool and the arena go
        gpu_hello = gpu.hello_info()
    disk_mover = None
    if store.disk_ledger is not None:
        rebuild_index(store, store.disk_ledger)
        disk_mover = DiskMover(store.disk_ledger, store.disk_ledger.disk, host, config.disk_io_depth,
                               config.disk_queue_limit)
        take(disk_mover.close)
    remote = None
    if config.remote:
        remote = RemoteMover(store.remote_ledger, open_remote(config, arena, claims), config.chunk_limit)
        take(lambda: remote.close(remote_close_wait()))   # its workers use the arena
    safeguards = Safeguards(store, disk_mover, config.scrub_rate)
    take(safeguards.close)   # its worker hashes arena slots: before the arena is unmapped
    adoption = open_adoption(store, kept, config.lease_ttl, claims)
    if adoption is not None:
        safeguards.kept_waiting = adoption.holds   # a namespace being adopted holds chunks (server/requests/compat.py)
    return Tiers(store, safeguards, disk_mover=disk_mover, gpu_mover=gpu_mover, gpu_hello=gpu_hello, remote=remote,
                 index=index, events=publisher, event_log=event_log, adoption=adoption)


def open_adoption(store: Store, kept: KeptArena | None, lease_ttl: float, claims: Claims) -> Adoption | None:
    """The verification of what the arena kept from the last daemon (None: nothing was kept), logged."""
    if kept is None:
        return None
    adoption = Adoption(store, kept, lease_ttl)
    claims.take(adoption.close)   # its worker hashes kept slots: before the arena is unmapped
    logs.info("arena_adoption", **({"state": kept.report.state, "reason": kept.report.reason}
                                   if kept.report.reason else
                                   {"state": kept.report.state, "chunks": len(kept.chunks),
                                    "unfit_chunks": kept.report.unfit_chunks}))
    return adoption


def open_events(config: ServerConfig, claims: Claims) -> tuple[EventPublisher | None, EventLog | None]:
    """The KV cache event publisher and the Store's event log, when ``--events-endpoint`` asks for them (else
    None and None). The first event of every start is ``AllBlocksCleared``; the chunks adopted after it are
    announced as stored."""
    if not config.events_endpoint:
        return None, None
    publisher = EventPublisher(EventSettings(
        config.events_endpoint, config.events_replay_endpoint, config.events_buffer, config.events_hwm,
        config.events_format, config.events_topic))
    claims.take(publisher.close)   # after the Store's last change: registered before the movers' closers
    event_log = EventLog(publisher.submit, publisher.wake)
    publisher.holdings = event_log.snapshot
    publisher.drain = event_log.drain
    publisher.noted = event_log.noted
    event_log.all_cleared()
    logs.info("kv_events", endpoint=config.events_endpoint, replay=config.events_replay_endpoint or None,
              format=config.events_format, incarnation=publisher.incarnation)
    return publisher, event_log


def rebuild_index(store: Store, ledger: DiskLedger) -> None:
    """Index every valid chunk file, oldest first (so the disk LRU order survives a restart)."""
    disk = ledger.disk
    started = time.monotonic()
    found = disk.scan()
    adopted = 0
    for header, _mtime in sorted(found.chunks, key=lambda c: c[1]):
        if ledger.adopt(header.key, header.raw_len, header.namespace, disk.footprint(header.stored_len),
                       header.payload_sum if header.raw_sum else None, header.parent, header.engine,
                       header.retention):
            store.kept.learn_params(header.namespace, header.params)
            adopted += 1
        else:
            disk.remove(header.key)  # over a lowered cap, or a duplicate
    elapsed = time.monotonic() - started
    for name, reason in found.quarantined:
        logs.warning("disk_file_quarantined", file=name, reason=reason)
    if found.foreign:
        logs.warning("disk_foreign_files_ignored", count=len(found.foreign), first=found.foreign[0])
    store.tier_counters.quarantined += len(found.quarantined)
    logs.info("disk_index_rebuilt", directory=disk.directory, chunks=adopted, dropped=len(found.chunks) - adopted,
              quarantined=len(found.quarantined), foreign=len(found.foreign), temps_removed=found.temps_removed,
              renamed=found.renamed,
              seconds=round(elapsed, 3), chunks_per_s=round(len(found.chunks) / elapsed) if elapsed else 0,
              direct_io=disk.direct, capacity_bytes=disk.capacity_bytes, used_bytes=disk.used_bytes)


def open_gpu(config: ServerConfig, arena: SharedArena, claims: Claims) -> Any:
    """The GPU tier on ``cuda:N`` (or on cpu under the testing switch, ``tiers/gpu/settings.py``), or None."""
    if not config.gpu_mem:
        return None
    from ...tiers.gpu.settings import TEST_DEVICE_ENV, tier_device  # imports torch: only with a GPU tier
    from ...tiers.gpu.tier import GpuTier

    device = tier_device(config.gpu_device)
    shared = arena_path_for(config.socket + "#gpu") if device == "cpu" else None
    if shared is not None:
        logs.warning("gpu_tier_on_cpu", reason=f"{TEST_DEVICE_ENV}=cpu: a CPU-backed GPU tier, for tests only")
    gpu = GpuTier(config.gpu_mem, device, arena.buf, arena.size, shared_path=shared)
    claims.take(gpu.close)   # unpins the arena: before the arena is unmapped
    if shared is not None:
        claims.leftovers.append(shared)
    logs.info("gpu_tier", device=str(gpu.device), capacity_bytes=gpu.capacity_bytes,
              host_pinned=bool(gpu.page_locked and gpu.page_locked.locked))
    return gpu


def open_remote(config: ServerConfig, arena: SharedArena, claims: Claims) -> Any:
    """The remote store's backend (constructing it never waits for the store)."""
    from ...tiers.remote import RemoteError, open_backend   # imports the store's client library: only when asked

    try:
        backend = open_backend(config.remote, namespace=REMOTE_NAMESPACE, timeout=REMOTE_TIMEOUT,
                               retry_interval=REMOTE_RETRY,
                               max_pending_bytes=min(REMOTE_MAX_PENDING, config.host_mem // 4))
    except (RemoteError, ValueError) as exc:
        raise ConfigError(f"--remote: {redact_url(str(exc))}") from None
    claims.take(backend.close, 0.0)   # a no-op once the remote mover has closed it (with its stop's wait)
    zero_copy = backend.register_memory(arena.buf)
    # Asked once now, for at most one metadata deadline, so that a store down at start is said at start (the
    # check's remote_unavailable warning, with the reason) rather than at the first miss; the daemon serves
    # either way, and the tier comes back by itself when the store answers.
    up = backend.check(REMOTE_TIMEOUT)
    logs.info("remote_tier", url=backend.url, zero_copy=zero_copy, up=up)
    return backend
