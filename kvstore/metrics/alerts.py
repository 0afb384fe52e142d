"""Prometheus alerting rules, generated from the metric definitions (``kvstore alerts`` prints them as YAML).

The rules follow the project's brief: prefix hit rate below 30 % for 10 minutes (warning: the cache is too
small or keys do not match across engines), an eviction storm in a tier (warning), p99 get latency too high
(warning), and any checksum failure or disk I/O error (critical: a disk is going bad).

A full tier alone is no alarm: a warm cache sits at its high watermark and evicts its coldest chunks, as it
should. What hurts is sustained pressure, a tier that is full *and* turns its whole content over faster than
prefixes come back: ``KVStoreTierNearlyFull`` fires when a tier above 95 % full has evicted, over
``TURNOVER_WINDOW``, more chunks than it holds, for that long (a storm, not one burst of large puts).

Any damaged chunk copy found in memory or by a scrub, and any mismatch an engine's verification reports, are
critical too: bad memory or a client scribbling on the shared arena, found before users read wrong
answers. Thresholds are the constants below.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from . import queries as q

HIT_RATE_MIN = 0.30
TIER_FILL_MAX = 0.95
TURNOVER_WINDOW = "15m"   # a tier that evicts more chunks than it holds in this long, for this long, is in a storm
GET_P99_MAX_S = 0.25
TENANT_CEILING_FILL = 0.98


@dataclass(frozen=True)
class AlertRule:
    alert: str
    expr: str
    duration: str
    severity: str
    summary: str
    description: str

    def as_dict(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.alert, "expr": self.expr}
        if self.duration != "0m":
            rule["for"] = self.duration
        rule["labels"] = {"severity": self.severity}
        rule["annotations"] = {"summary": self.summary, "description": self.description}
        return rule


def alert_rules() -> list[AlertRule]:
    return [
        AlertRule("KVStorePrefixHitRateLow", f"({q.hit_rate('5m')}) < {HIT_RATE_MIN}", "10m", "warning",
                  "kvstore prefix hit rate below 30 %",
                  "{{ $labels.instance }}: only {{ $value | humanizePercentage }} of looked-up tokens were "
                  "stored over the last 10 minutes. The cache may be too small, or engines may use "
                  "different namespaces or chunk sizes for the same model."),
        AlertRule("KVStoreTierNearlyFull", q.eviction_storm(TIER_FILL_MAX, TURNOVER_WINDOW), TURNOVER_WINDOW,
                  "warning", "kvstore tier {{ $labels.tier }} full and evicting faster than it is reused",
                  "{{ $labels.instance }}: tier {{ $labels.tier }} is above 95 % full and has evicted more chunks "
                  f"in {TURNOVER_WINDOW} than it holds, for {TURNOVER_WINDOW}: stored prefixes leave before they "
                  "come back (being full alone is a warm cache's normal state). Give the tier more capacity or "
                  "add a lower tier, and watch KVStorePrefixHitRateLow."),
        AlertRule("KVStoreGetLatencyHigh", f"{q.latency_quantile(0.99, 'get')} > {GET_P99_MAX_S}", "10m",
                  "warning", "kvstore p99 load (get) latency high",
                  "{{ $labels.instance }}: p99 get latency is {{ $value | humanizeDuration }} "
                  f"(threshold {GET_P99_MAX_S}s). Engines wait this long before prefill can start."),
        AlertRule("KVStoreChecksumFailures", f"{q.increase('checksum_failures')} > 0", "0m", "critical",
                  "kvstore disk chunk failed its checksum",
                  "{{ $labels.instance }}: {{ $value }} chunks read from disk failed their checksum in 5 "
                  "minutes (served as misses, never as data). Check the disk and its filesystem."),
        AlertRule("KVStoreCorruptChunks", f"{q.increase('corrupt_chunks')} > 0", "0m", "critical",
                  "kvstore found damaged chunks",
                  "{{ $labels.instance }}: {{ $value }} chunk copies failed their checksum in 5 minutes (at a "
                  "move between tiers, a verified get or a scrub); they were repaired or dropped, never served. "
                  "Bad memory, a failing disk, or a client writing into the shared arena: check `kvstore stats "
                  "--json` under integrity and the daemon's chunk_corrupt log lines."),
        AlertRule("KVStoreScrubFoundDamage", f"{q.increase('scrub_corrupt')} > 0", "0m", "critical",
                  "kvstore scrub found damaged chunks",
                  "{{ $labels.instance }}: a scrub found {{ $value }} damaged chunk copies in 5 minutes (see the "
                  "scrub_done and chunk_corrupt log lines for the tier)."),
        AlertRule("KVStoreVerifyMismatch", f"{q.increase('verify_mismatches')} > 0", "0m", "critical",
                  "kvstore chunks differ from the KV an engine computed",
                  "{{ $labels.instance }}: engines' verification found {{ $value }} stored chunks that differ "
                  "from the KV they computed for the same tokens in 5 minutes (the chains were dropped). A "
                  "layout or kernel change, or wrong bytes written at put: see the verify_mismatch log line "
                  "for the namespace."),
        AlertRule("KVStoreTenantAtCeiling", f"{q.tenant_ceiling_fill()} > {TENANT_CEILING_FILL}", "10m", "warning",
                  "kvstore tenant {{ $labels.tenant }} held at its {{ $labels.tier }} ceiling",
                  "{{ $labels.instance }}: tenant {{ $labels.tenant }} has used {{ $value | humanizePercentage }} "
                  "of its {{ $labels.tier }} ceiling for 10 minutes: its own oldest chunks there are evicted "
                  "for its new ones, or its puts refused (dram) and its copies not made (disk, gpu). Raise its "
                  "ceiling in the [tenants] table if its hit rate matters."),
        AlertRule("KVStoreDiskIOErrors", f"{q.increase('io_errors')} > 0", "0m", "critical",
                  "kvstore disk I/O errors",
                  "{{ $labels.instance }}: {{ $value }} disk I/O errors in 5 minutes. Check the disk tier's "
                  "device and free space."),
    ]


def rules_document() -> dict[str, Any]:
    return {"groups": [{"name": "kvstore", "rules": [r.as_dict() for r in alert_rules()]}]}


def to_yaml(value: Any, indent: int = 0) -> str:
    """A small YAML writer for rule files: mappings, sequences, numbers and strings (double-quoted)."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:\n{to_yaml(item, indent + 2)}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            text = to_yaml(item, indent + 2) if isinstance(item, (dict, list)) else pad + "  " + _scalar(item)
            lines.append(f"{pad}- {text.lstrip()}")
        return "\n".join(lines)
    return pad + _scalar(value)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def rules_yaml() -> str:
    header = "# Prometheus alerting rules for kvstore (generated by `kvstore alerts`).\n"
    return header + to_yaml(rules_document()) + "\n"
