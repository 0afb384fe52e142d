"""The daemon's ``stats`` reply: one plain dictionary of the store's counters, tiers, movers and sessions.

Taken on the event loop (the exporter asks through ``Daemon.stats_snapshot``) from the service (``service.py``) and the
daemon's session count; every value is a number, a string
or a dictionary of those, so the same snapshot serves ``kvstore stats``, the wire reply and Prometheus. Nothing
secret is in it: the remote tier reports counters only, never its URL.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .._version import __version__

if TYPE_CHECKING:
    from ..store.store import Store
    from .service import Service


def daemon_stats(d: "Service", sessions: int, auth_rejected: int) -> dict[str, Any]:
    store = d.store
    return {
        "version": __version__,
        "uptime_s": round(time.time() - d.started, 3),
        "tiers": tier_stats(store),
        "chunks": store.committed_chunks(),
        "lookup_tokens": d.counters.lookup_tokens,
        "hit_tokens": d.counters.hit_tokens,
        "counters": {**store.counters.__dict__, **store.tier_counters.__dict__},
        "disk": d.manager.stats() if d.manager is not None else None,
        "gpu": d.gpu_mover.stats() if d.gpu_mover is not None else None,
        "remote": d.remote.stats() if d.remote is not None else None,
        **d.safeguards.stats(),   # integrity, scrub, verify
        "leases": len(store.leases),
        "leases_overdue": store.leases.overdue,
        "reservations": len(store.reservations),
        "credits": store.credits.stats(),
        "sessions": sessions,
        "requests": d.counters.requests,
        "errors": d.counters.errors,
        "auth_rejected": auth_rejected,
    }


def tier_stats(store: "Store") -> dict[str, dict[str, Any]]:
    usage = store.host.usage()
    tiers: dict[str, dict[str, Any]] = {"host": {"capacity_bytes": usage.capacity_bytes,
                                                 "used_bytes": usage.used_bytes - store.credits.lent_bytes,
                                                 "chunks": usage.chunks - len(store.credits)}}   # lent: "credits"
    disk = store.disk
    if disk is not None:
        tiers["disk"] = {"capacity_bytes": disk.capacity_bytes, "used_bytes": disk.used_bytes, "chunks": disk.chunks}
    gpu = store.gpu
    if gpu is not None:
        used = gpu.usage()
        tiers = {"gpu": {"capacity_bytes": used.capacity_bytes, "used_bytes": used.used_bytes,
                         "chunks": used.chunks, "device": str(gpu.device)}, **tiers}
    return tiers
