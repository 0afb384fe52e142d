"""PromQL expressions built from the metric definitions, shared by the alert rules and the dashboard.

Every expression names its metrics through ``metric(...)``, which fails at import for a name that is not
defined, so a rule or a panel cannot drift from what the daemon exports.
"""

from __future__ import annotations

import re

from .definitions import exported_series, metric


def series(name: str) -> str:
    return metric(name).sample_name


def rate(name: str, window: str = "5m", by: str = "") -> str:
    inner = f"rate({series(name)}[{window}])"
    return f"sum by ({by}) ({inner})" if by else inner


def hit_rate(window: str = "5m") -> str:
    """Fraction of looked-up tokens found stored, per daemon."""
    return (f"sum by (instance) (rate({series('hit_tokens')}[{window}]))"
            f" / sum by (instance) (rate({series('lookup_tokens')}[{window}]))")


def tier_fill() -> str:
    """Fraction of each tier in use."""
    return f"{series('tier_used_bytes')} / {series('tier_capacity_bytes')}"


def eviction_storm(fill: float, window: str) -> str:
    """The tiers above ``fill`` full that evicted more chunks over ``window`` than they hold now."""
    evicted = f"sum by (instance, tier) (increase({series('evictions')}[{window}]))"
    held = f"sum by (instance, tier) ({series('tier_chunks')})"
    return f"({tier_fill()} > {fill}) and on (instance, tier) ({evicted} > {held})"


def tenant_ceiling_fill() -> str:
    """Fraction of each tenant's ceiling in use, per tier (a tenant without a ceiling in a tier has no series)."""
    return f"{series('tenant_bytes')} / {series('tenant_ceiling_bytes')}"


def latency_quantile(q: float, op: str | None = None, window: str = "5m", by: str = "instance") -> str:
    name = metric("request_duration_seconds").name + "_bucket"
    selector = f'{name}{{op="{op}"}}' if op else name
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({selector}[{window}])))"


def increase(name: str, window: str = "5m") -> str:
    return f"sum by (instance) (increase({series(name)}[{window}]))"


_NAME = re.compile(r"\bkvstore_[a-zA-Z0-9_]*")


def undefined_names(expr: str) -> set[str]:
    """The ``kvstore_*`` names in ``expr`` that no definition exports (empty when the expression is sound)."""
    return set(_NAME.findall(expr)) - exported_series()
