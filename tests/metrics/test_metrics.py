"""Metric definitions, and what is generated from them: alert rules and the Grafana dashboard."""

from __future__ import annotations

import json

import pytest
import yaml

from kvstore.metrics import alerts, dashboard, queries
from kvstore.metrics.collector import family_of, unmapped_paths
from kvstore.metrics.definitions import METRICS, PREFIX, exported_series, flatten, metric

from harness.daemons import run_cli


def test_every_definition_is_well_formed():
    for m in METRICS:
        assert m.name.startswith(PREFIX) and not m.name.endswith("_total"), m.name
        assert m.kind in ("counter", "gauge", "histogram") and m.help.endswith("."), m.name
        assert bool(m.sources) != (m.kind == "histogram"), m.name
        assert m.kind != "histogram" or (m.buckets and list(m.buckets) == sorted(m.buckets)), m.name
    with pytest.raises(KeyError, match="kvstore_nope"):
        metric("nope")


def test_sources_capture_tiers_and_tier_pairs_generically():
    stats = {"tiers": {"host": {"capacity_bytes": 10, "used_bytes": 4, "chunks": 1},
                       "disk": {"capacity_bytes": 100, "used_bytes": 50, "chunks": 7}},
             "counters": {"promotions_disk_host": 3, "promoted_bytes_disk_host": 300,
                          "demotions_host_disk": 2, "evictions": 9, "evictions_disk": 5, "evictions_host": 1}}
    paths = list(flatten(stats))
    used = family_of(metric("tier_used_bytes"), paths)
    assert {(s.labels["tier"], s.value) for s in used.samples} == {("host", 4), ("disk", 50)}
    promos = family_of(metric("promotions"), paths)
    assert [(s.name, s.labels, s.value) for s in promos.samples] == [
        ("kvstore_promotions_total", {"src": "disk", "dst": "host"}, 3)]
    # a per-tier counter wins over the older unlabelled one for the same tier
    evictions = {(s.labels["tier"], s.value) for s in family_of(metric("evictions"), paths).samples}
    assert evictions == {("disk", 5), ("host", 1)}
    assert unmapped_paths({**stats, "counters": {"brand_new_counter": 1}}) == ["counters.brand_new_counter"]


def test_alert_rules_parse_and_name_only_defined_metrics():
    text = run_cli("alerts", check=True).stdout
    doc = yaml.safe_load(text)
    assert doc == alerts.rules_document()
    rules = {r["alert"]: r for r in doc["groups"][0]["rules"]}
    assert set(rules) == {"KVStorePrefixHitRateLow", "KVStoreTierNearlyFull", "KVStoreGetLatencyHigh",
                          "KVStoreTenantAtCeiling",
                          "KVStoreChecksumFailures", "KVStoreDiskIOErrors", "KVStoreCorruptChunks",
                          "KVStoreScrubFoundDamage", "KVStoreVerifyMismatch"}
    for damage in ("KVStoreCorruptChunks", "KVStoreScrubFoundDamage", "KVStoreVerifyMismatch"):
        assert rules[damage]["labels"]["severity"] == "critical" and "for" not in rules[damage]
    assert rules["KVStorePrefixHitRateLow"]["for"] == "10m" and "< 0.3" in rules["KVStorePrefixHitRateLow"]["expr"]
    full = rules["KVStoreTierNearlyFull"]   # a storm of evictions in a full tier, not fullness alone
    assert full["for"] == "15m" and "> 0.95" in full["expr"] and full["labels"]["severity"] == "warning"
    assert "increase(kvstore_evictions_total[15m])" in full["expr"] and "kvstore_tier_chunks" in full["expr"]
    assert rules["KVStoreGetLatencyHigh"]["labels"]["severity"] == "warning"
    for rule in rules.values():
        assert queries.undefined_names(rule["expr"]) == set(), rule["alert"]
        assert "kvstore_" in rule["expr"]


def test_undefined_name_check_catches_drift():
    assert queries.undefined_names("rate(kvstore_lookups_total[5m]) / kvstore_not_a_metric") == {"kvstore_not_a_metric"}
    assert queries.undefined_names("kvstore_lookups") == {"kvstore_lookups"}  # a counter needs _total
    assert "kvstore_request_duration_seconds_bucket" in exported_series()


def test_dashboard_is_json_and_names_only_defined_metrics():
    text = run_cli("dashboard", check=True).stdout
    board = json.loads(text)
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert exprs == dashboard.expressions() and len(exprs) > 10
    for expr in exprs:
        assert queries.undefined_names(expr) == set(), expr
    titles = {p["title"] for p in board["panels"]}
    assert {"Prefix hit rate (tokens)", "Tier fill", "Request latency p99", "Errors",
            "Integrity: damaged copies and scrubs", "Verification by engines"} <= titles


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _served_series(port: int) -> set[tuple[str, frozenset]]:
    """(sample name, labels) of every sample a daemon's /metrics serves."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())) for f in text_string_to_metric_families(text) for s in f.samples}


def _wanted(expr: str) -> list[tuple[str, frozenset]]:
    """Each ``kvstore_*`` name ``expr`` uses, with the label matchers written beside it (``{op="get"}``)."""
    import re

    wanted = []
    for m in re.finditer(r"\b(kvstore_[a-zA-Z0-9_]*)(\{([^}]*)\})?", expr):
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        wanted.append((m.group(1), labels))
    return wanted


def test_every_family_an_alert_or_panel_uses_is_served_from_start(start_daemon):
    """A fresh daemon (no request, no scrub yet) serves every series an alert or a dashboard panel reads, at
    zero: an alert on a series that appears only after the first event never fires on that first event."""
    port = _free_port()
    start_daemon("--metrics-port", str(port))
    served = _served_series(port)
    exprs = [r.expr for r in alerts.alert_rules()] + dashboard.expressions()
    missing = set()
    for expr in exprs:
        for name, labels in _wanted(expr):
            if name.endswith("_ceiling_bytes"):
                continue   # a ceiling's series exists where a ceiling does (none without a [tenants] table)
            if not any(n == name and labels <= have for n, have in served):
                missing.add((name, tuple(sorted(labels))))
    assert not missing, sorted(missing)
    assert ("kvstore_scrub_corrupt_total", frozenset({("tier", "host")})) in served
    assert ("kvstore_tenant_bytes", frozenset({("tenant", "default"), ("tier", "dram")})) in served
