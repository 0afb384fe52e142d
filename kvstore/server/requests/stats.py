"""The daemon's ``stats`` reply: one plain dictionary of the store's counters, tiers, movers and sessions.

Taken on the event loop (the exporter asks through ``Daemon.stats_snapshot``) from the service (``service.py``) and the
daemon's sessions; every value is a number, a string, a dictionary of those or a list of such dictionaries (one
row per engine connector), so the same snapshot serves ``kvstore stats``, the wire reply and Prometheus. Nothing
secret is in it: the remote tier reports counters only, never its URL.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable

from ... import native
from ..._version import __version__

if TYPE_CHECKING:
    from ...store.store import Store
    from .service import Service
    from .session import Session


def daemon_stats(d: "Service", sessions: int, auth_rejected: int,
                 connectors: dict[str, Any] | None = None) -> dict[str, Any]:
    store = d.store
    return {
        "version": __version__,
        "native": native.describe(),   # the paths that run in C: "index,copy", "index" or "none"
        "uptime_s": round(time.time() - d.started, 3),
        "tiers": tier_stats(store),
        "chunks": store.committed_chunks(),
        "lookup_tokens": d.counters.lookup_tokens,
        "hit_tokens": d.counters.hit_tokens,
        "counters": {**store.counters.__dict__, **store.tier_counters.__dict__},
        "disk": d.disk_mover.stats() if d.disk_mover is not None else None,
        "gpu": d.gpu_mover.stats() if d.gpu_mover is not None else None,
        "remote": d.remote.stats() if d.remote is not None else None,
        "events": d.events.stats() if d.events is not None else None,
        "load_ns_per_kib": load_costs(d),
        "adoption": d.adoption.report.fields() if d.adoption is not None else None,
        **d.safeguards.stats(),   # integrity, scrub, verify
        "leases": len(store.leases),
        "leases_overdue": store.leases.overdue,
        "reservations": len(store.puts.reservations),
        "credits": store.credits.stats(),
        "retention": store.retention.soft_pins.stats(),
        **({"tenants": d.tenant_stats()} if store.budgets.active else {}),
        "sessions": sessions,
        **(connectors or {"connectors": {}, "connector_list": []}),
        "requests": d.counters.requests,
        "errors": d.counters.errors,
        "auth_rejected": auth_rejected,
    }


def load_costs(d: "Service") -> dict[str, int]:
    """What loading a KiB from each tier costs, per KV cache event medium, as far as it is measured: the disk
    tier's promotion reads (``STORAGE``), timed by the daemon; DRAM (``CPU``) and GPU-tier (``GPU``) hits, which the
    engines' clients copy themselves, as their connectors report them (``load_costs.py``). A router weighs each
    medium's blocks by it (``kvstore/routing/events_router.py``); a medium nobody has loaded from yet is left out
    (the router then takes its configured cost)."""
    costs = d.load_costs.ns_per_kib()
    disk = d.disk_mover.stats() if d.disk_mover is not None else None
    if disk and disk.get("read_ns_per_kib"):
        costs["STORAGE"] = int(disk["read_ns_per_kib"])
    return costs


def connector_stats(sessions: Iterable["Session"]) -> dict[str, Any]:
    """Engine connectors that said what they are: counts by engine and state, and one row each."""
    counts: dict[str, dict[str, int]] = {}
    rows = []
    for session in sessions:
        c = session.connector
        if c is None:
            continue
        counts.setdefault(c.engine, {"on": 0, "off": 0})[c.state] += 1
        rows.append({"engine": c.engine, "family": c.family, "state": c.state, "reason": c.reason,
                     "client_id": session.client_id})
    return {"connectors": counts, "connector_list": rows}


def tier_stats(store: "Store") -> dict[str, dict[str, Any]]:
    usage = store.host.usage()
    tiers: dict[str, dict[str, Any]] = {"host": {"capacity_bytes": usage.capacity_bytes,
                                                 "used_bytes": usage.used_bytes - store.credits.lent_bytes,
                                                 "chunks": usage.chunks - len(store.credits),   # lent: "credits"
                                                 "reserved_bytes": store.host.reserved_bytes,
                                                 "backing_refused": store.host.backing_refused}}
    disk = store.disk
    if disk is not None:
        tiers["disk"] = {"capacity_bytes": disk.capacity_bytes, "used_bytes": disk.used_bytes, "chunks": disk.chunks}
    gpu = store.gpu
    if gpu is not None:
        used = gpu.usage()
        tiers = {"gpu": {"capacity_bytes": used.capacity_bytes, "used_bytes": used.used_bytes,
                         "chunks": used.chunks, "device": str(gpu.device)}, **tiers}
    return tiers
