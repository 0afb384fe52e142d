"""Scrape-time collector: the store's gauges and counters, read from one ``Daemon.stats()`` snapshot.

Nothing is counted twice: the daemon and its store keep plain integer counters (cheap on the request path), and
this collector turns one snapshot of them into metric families each time Prometheus scrapes, matching the
snapshot's dotted paths against the sources in ``definitions.py``. It is generic over tiers and tier pairs: a
tier or counter that appears in ``stats()`` appears on ``/metrics`` with no change here. The snapshot is taken
on the daemon's event loop (see ``Daemon.stats_snapshot``), so the index is never read while it changes.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..tenants.table import DEFAULT_TENANT
from .definitions import METRICS, MetricDef, flatten

Snapshot = Callable[[], dict]


class StatsCollector(Collector):
    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        paths = list(flatten(with_default_tenant(self._snapshot())))
        for definition in METRICS:
            if definition.sources:
                yield family_of(definition, paths)

    def describe(self) -> Iterator[Metric]:
        for definition in METRICS:
            if definition.sources:
                yield family_of(definition, [])


# A tier's name in ``stats()["tiers"]`` against its name in a tenant's rows (``store/tenant_budgets.py``).
TENANT_TIER_NAMES = {"host": "dram", "disk": "disk", "gpu": "gpu"}


def with_default_tenant(stats: dict) -> dict:
    """``stats`` as the exporter reads it: without a ``[tenants]`` table every chunk belongs to the default
    tenant, which is served as one (its bytes per tier, no guarantee, no ceiling, nothing evicted by others), so
    the tenant families an alert or a panel reads exist from the start; with a table, ``stats`` unchanged."""
    if stats.get("tenants"):
        return stats
    tiers = stats.get("tiers", {})
    rows = {TENANT_TIER_NAMES[name]: {"bytes": tier["used_bytes"], "guaranteed": 0, "evicted_by_others": 0,
                                      "ceiling_refusals": 0}
            for name, tier in tiers.items() if name in TENANT_TIER_NAMES}
    host = tiers.get("host", {}).get("used_bytes", 0)
    default = {"dram_bytes": host, "dram_guaranteed": 0, "evicted_by_others": 0, "ceiling_refusals": 0,
               "tiers": rows, "lookup_tokens": stats.get("lookup_tokens", 0), "hit_tokens": stats.get("hit_tokens", 0)}
    return {**stats, "tenants": {DEFAULT_TENANT: default}}


def family_of(definition: MetricDef, paths: list[tuple[str, float]]) -> Metric:
    """One family holding every sample the snapshot offers for ``definition`` (first matching source wins)."""
    cls = CounterMetricFamily if definition.kind == "counter" else GaugeMetricFamily
    family = cls(definition.name, definition.help, labels=definition.labels)
    seen: set[tuple[str, ...]] = set()
    for source in definition.sources:
        for path, value in paths:
            labels = source.match(path)
            if labels is None:
                continue
            key = tuple(labels[name] for name in definition.labels)
            if key not in seen:
                seen.add(key)
                family.add_metric(list(key), value)
    return family


def unmapped_paths(stats: dict) -> list[str]:
    """Numeric paths of ``stats`` that no metric exports (a new counter someone forgot to define)."""
    sources = [s for m in METRICS for s in m.sources]
    return [path for path, _ in flatten(stats) if all(s.match(path) is None for s in sources)]
