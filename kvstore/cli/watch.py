"""``kvstore stats --watch``: a live view that refreshes in place, with rates between two snapshots.

Each refresh fetches ``stats`` over one kept-open connection and compares it with the previous snapshot: lookups,
hit tokens and bytes per second over the last interval and averaged since the daemon started (its total over its
uptime), the hit rate over that interval and since the daemon started. Bytes moved are puts (in), gets (out) and
promotions plus demotions (between tiers). Below them, the integrity of what is stored: damaged copies found (any
tier, any check) and what became of them, scrubs, and engines' verification; a line turns red while anything there
is non-zero. With a tenants table, last, each tenant's use of every tier against its budget, evictions by others,
ceiling refusals and hit rate.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from rich.console import Console, Group
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table

from ..metrics.definitions import flatten
from ..units import format_size


@dataclass(frozen=True)
class Sample:
    at: float
    values: dict[str, float]

    @classmethod
    def of(cls, stats: dict[str, Any]) -> "Sample":
        return cls(time.monotonic(), dict(flatten(stats)))

    def sum(self, prefix: str) -> float:
        return sum(v for k, v in self.values.items() if k.startswith(prefix))

    def get(self, path: str) -> float:
        return self.values.get(path, 0)


def _per_tier_or_total(sample: Sample, name: str) -> float:
    """``counters.<name>_<tier>`` summed over tiers where the store counts per tier, else ``counters.<name>``."""
    per_tier = sample.sum(f"counters.{name}_")
    return per_tier if per_tier else sample.get(f"counters.{name}")


QUANTITIES: dict[str, Callable[[Sample], float]] = {
    "lookups": lambda s: s.get("counters.lookups"),
    "lookup_tokens": lambda s: s.get("lookup_tokens"),
    "hit_tokens": lambda s: s.get("hit_tokens"),
    "bytes_in": lambda s: s.get("counters.put_bytes"),
    "bytes_out": lambda s: s.get("counters.get_bytes"),
    "bytes_between": lambda s: s.sum("counters.promoted_bytes_") + s.sum("counters.demoted_bytes_"),
    "evictions": lambda s: _per_tier_or_total(s, "evictions"),
    "scrubbed": lambda s: sum(v for k, v in s.values.items() if k.startswith("scrub.tiers.") and k.endswith(".bytes")),
}


def quantity(sample: Sample, name: str) -> float:
    return QUANTITIES[name](sample)


def rates(prev: Sample | None, cur: Sample) -> dict[str, float]:
    """Each quantity per second between two snapshots (empty for the first frame)."""
    if prev is None or cur.at <= prev.at:
        return {}
    dt = cur.at - prev.at
    return {name: max(0.0, (quantity(cur, name) - quantity(prev, name)) / dt) for name in QUANTITIES}


def rates_since_start(cur: Sample, uptime_s: float) -> dict[str, float]:
    """Each quantity per second averaged over the daemon's uptime: its total since start over the uptime
    (empty before the first second, where the average means nothing)."""
    if uptime_s < 1.0:
        return {}
    return {name: quantity(cur, name) / uptime_s for name in QUANTITIES}


def percent(num: float, den: float) -> str:
    """``num`` as a share of ``den`` (``39.1 %``), ``-`` when ``den`` is 0: the one format of ``stats``' tables."""
    return f"{100.0 * num / den:.1f} %" if den else "-"


def render(stats: dict[str, Any], prev: Sample | None, cur: Sample, address: str) -> Group:
    r = rates(prev, cur)
    since = rates_since_start(cur, float(stats.get("uptime_s", 0)))
    tiers = Table(title=f"kvstore {stats.get('version', '')} — up {stats.get('uptime_s', 0):.0f}s",
                  caption=address)
    for col in ("tier", "capacity", "used", "use %", "chunks"):
        tiers.add_column(col, justify="left" if col == "tier" else "right")
    for name, t in stats.get("tiers", {}).items():
        tiers.add_row(name, format_size(t["capacity_bytes"]), format_size(t["used_bytes"]),
                      percent(t["used_bytes"], t["capacity_bytes"]), str(t["chunks"]))
    live = Table(show_header=True)
    live.add_column("")
    live.add_column("last interval", justify="right")
    live.add_column("since start", justify="right")
    interval_rate = percent(r["hit_tokens"], r["lookup_tokens"]) if r else "-"
    live.add_row("hit rate (tokens)", interval_rate, percent(stats["hit_tokens"], stats["lookup_tokens"]))
    per_s: list[tuple[str, str, Callable[[int], str]]] = [
        ("lookups/s", "lookups", str), ("hit tokens/s", "hit_tokens", str),
        ("bytes in/s (put)", "bytes_in", format_size), ("bytes out/s (get)", "bytes_out", format_size),
        ("bytes between tiers/s", "bytes_between", format_size), ("evictions/s", "evictions", str)]
    per_s.append(("bytes scrubbed/s", "scrubbed", format_size))
    for label, name, fmt in per_s:
        live.add_row(label, fmt(int(r[name])) if r else "-", fmt(int(since[name])) if since else "-")
    live.add_row("leases / reservations / clients", "",
                 f"{stats['leases']} / {stats['reservations']} / {other_clients(stats)}")
    for label, text, bad in integrity_rows(cur):
        live.add_row(f"[red]{label}[/red]" if bad else label, "", f"[red]{text}[/red]" if bad else text)
    tenants = tenant_table(stats)
    return Group(tiers, live, *([tenants] if tenants is not None else []))


def other_clients(stats: dict[str, Any]) -> int:
    """The daemon's clients less the one ``kvstore stats`` itself holds while it asks."""
    return max(0, int(stats["sessions"]) - 1)


# A tenant's row per tier (``tenant_budgets.py``'s names) against the key of ``stats["tiers"]`` that says the
# tier runs; the remote tier's rows come only when it runs.
TENANT_TIERS = {"dram": "host", "disk": "disk", "gpu": "gpu"}


def tier_runs(stats: dict[str, Any], tier: str) -> bool:
    """Whether the daemon runs ``tier`` (a tenant row's name: dram, disk, gpu, remote)."""
    running = stats.get("tiers", {})
    return TENANT_TIERS[tier] in running if tier in TENANT_TIERS else True


def tenant_table(stats: dict[str, Any]) -> Table | None:
    """Each tenant's use of every budgeted tier the daemon runs against its guarantee and ceiling, the chunks
    other tenants' puts evicted, its refusals at the ceiling, and its token hit rate (None: no tenants table)."""
    tenants = stats.get("tenants")
    if not tenants:
        return None
    table = Table(title="tenants")
    for col in ("tenant", "tier", "used", "guaranteed", "ceiling", "% of ceiling", "evicted by others",
                "ceiling refusals", "hit rate (tokens)"):
        table.add_column(col, justify="left" if col in ("tenant", "tier") else "right")
    for name, row in tenants.items():
        rate = percent(row.get("hit_tokens", 0), row.get("lookup_tokens", 0))
        shown = [(tier, t) for tier, t in row.get("tiers", {}).items() if tier_runs(stats, tier)]
        for i, (tier, t) in enumerate(shown):
            ceiling = t["ceiling"]
            table.add_row(name if i == 0 else "", tier, format_size(t["bytes"]), format_size(t["guaranteed"]),
                          "-" if ceiling is None else format_size(ceiling),
                          "-" if ceiling is None else percent(t["bytes"], ceiling), str(t["evicted_by_others"]),
                          str(t["ceiling_refusals"]), rate if i == 0 else "")
    return table


def integrity_rows(s: Sample) -> list[tuple[str, str, bool]]:
    """(label, value, alarming) for the integrity lines of the live view."""
    damaged = int(s.sum("integrity.corrupt_"))
    scrub_corrupt = int(sum(v for k, v in s.values.items() if k.startswith("scrub.") and k.endswith(".corrupt")))
    mismatches = int(s.get("verify.mismatches"))
    return [
        ("damaged copies / repaired / dropped",
         f"{damaged} / {int(s.get('integrity.repaired'))} / {int(s.get('integrity.dropped'))}", damaged > 0),
        ("scrub passes / corrupt found", f"{int(s.get('scrub.passes'))} / {scrub_corrupt}", scrub_corrupt > 0),
        ("verify checks / mismatches / max diff",
         f"{int(s.get('verify.checks'))} / {mismatches} / {s.get('verify.max_difference'):.3g}", mismatches > 0),
    ]


def print_whole(console: Console, renderable: Any) -> None:
    """Print ``renderable``; into a file or a pipe as wide as it needs, never cut to the width of a terminal that
    is not there (a terminal's width still applies on a terminal)."""
    if console.is_terminal:
        console.print(renderable)
        return
    needed = Measurement.get(console, console.options.update_width(1 << 14), renderable).maximum
    console.width = max(needed, console.width)   # print's own width may only narrow the console's
    console.print(renderable)


class Terminated(Exception):
    """SIGTERM arrived: end the watch as an interrupt would."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def frames(client: Any, address: str, interval: float, count: int) -> Iterator[Group]:
    """One rendered frame every ``interval`` seconds, ``count`` times (0: until interrupted)."""
    prev: Sample | None = None
    shown = 0
    while True:
        stats = client.stats()
        cur = Sample.of(stats)
        yield render(stats, prev, cur, address)
        prev, shown = cur, shown + 1
        if count and shown >= count:
            return
        time.sleep(interval)


def watch(client: Any, address: str, interval: float, count: int) -> int:
    """Refresh every ``interval`` seconds, ``count`` times (0: until interrupted or SIGTERM). On a terminal the
    view refreshes in place; into a file or a pipe each frame is printed whole and flushed at once, so that a
    reader (``tail -f``) sees it without waiting for the watch to end."""
    console = Console()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if console.is_terminal:
            with Live(console=console, refresh_per_second=4, auto_refresh=False) as live:
                for frame in frames(client, address, interval, count):
                    live.update(frame, refresh=True)
        else:
            for frame in frames(client, address, interval, count):
                print_whole(console, frame)
                sys.stdout.flush()
    except (KeyboardInterrupt, Terminated):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
