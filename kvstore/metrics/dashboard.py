"""A Grafana dashboard (JSON model), generated from the metric definitions (``kvstore dashboard`` prints it).

One row of panels per question an operator asks: is the cache paying off (hit rate, lookups), is it full
(tier fill and bytes), what moves (bytes per second in, out and between tiers), is it fast (latency quantiles
per operation), who holds what (leases, reservations, clients), is anything failing, and are the stored bytes
right (damaged copies, scrubs, engines' verification). Queries come from
``queries.py``; the datasource is a template variable so the file imports into any Grafana.
"""

from __future__ import annotations

import json
from typing import Any

from . import queries as q

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _panel(title: str, targets: list[tuple[str, str]], unit: str, x: int, y: int, w: int = 12) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}
                    for i, (expr, legend) in enumerate(targets)],
    }


def panels() -> list[dict[str, Any]]:
    moved = [(q.rate("put_bytes", by="instance"), "put {{instance}}"),
             (q.rate("get_bytes", by="instance"), "get {{instance}}"),
             (q.rate("promoted_bytes", by="instance, src, dst"), "promoted {{src}}→{{dst}}"),
             (q.rate("demoted_bytes", by="instance, src, dst"), "demoted {{src}}→{{dst}}"),
             (q.rate("evicted_bytes", by="instance, tier"), "evicted from {{tier}}")]
    rows = [
        ("Prefix hit rate (tokens)", [(q.hit_rate(), "{{instance}}")], "percentunit"),
        ("Lookups and hits", [(q.rate("lookups", by="instance"), "lookups/s {{instance}}"),
                              (q.rate("hit_tokens", by="instance"), "hit tokens/s {{instance}}")], "ops"),
        ("Tier fill", [(q.tier_fill(), "{{tier}} {{instance}}")], "percentunit"),
        ("Tier bytes used", [(q.series("tier_used_bytes"), "{{tier}} {{instance}}")], "bytes"),
        ("Bytes moved", moved, "Bps"),
        ("Chunks moved between tiers", [(q.rate("promotions", by="instance, src, dst"), "up {{src}}→{{dst}}"),
                                        (q.rate("demotions", by="instance, src, dst"), "down {{src}}→{{dst}}"),
                                        (q.rate("evictions", by="instance, tier"), "evicted {{tier}}")], "ops"),
        ("Request latency p50", [(q.latency_quantile(0.5, by="instance, op"), "{{op}}")], "s"),
        ("Request latency p99", [(q.latency_quantile(0.99, by="instance, op"), "{{op}}")], "s"),
        ("Leases, reservations, clients", [(q.series("leases_active"), "leases"),
                                           (q.series("reservations_active"), "reservations"),
                                           (q.series("clients_connected"), "clients")], "short"),
        ("Errors", [(q.increase("checksum_failures"), "checksum failures"), (q.increase("io_errors"), "I/O errors"),
                    (q.increase("request_errors"), "request errors"),
                    (q.increase("store_full_errors"), "store full")], "short"),
        ("Integrity: damaged copies and scrubs", [
            (f"sum by (instance, tier) (increase({q.series('corrupt_chunks')}[5m]))", "damaged {{tier}}"),
            (q.increase("corrupt_dropped_chunks"), "dropped"), (q.increase("repaired_chunks"), "repaired"),
            (q.rate("scrub_bytes", by="instance, tier"), "scrubbed B/s {{tier}}")], "short"),
        ("Verification by engines", [(q.increase("verify_checks"), "checks"),
                                     (q.increase("verify_mismatches"), "mismatches"),
                                     (q.series("verify_max_difference"), "max difference")], "short"),
    ]
    return [_panel(title, targets, unit, x=12 * (i % 2), y=8 * (i // 2))
            for i, (title, targets, unit) in enumerate(rows)]


def dashboard() -> dict[str, Any]:
    return {
        "title": "kvstore",
        "uid": "kvstore",
        "tags": ["kvstore"],
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": panels(),
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def expressions() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]
