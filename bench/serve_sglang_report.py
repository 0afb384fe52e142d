"""The markdown table of a `bench/serve_sglang.py` result (docs/benchmarks/serve-sglang.md quotes it).

    python -m bench.serve_sglang_report bench/results/serve-sglang-latest.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from bench.serve_report import cell

COLUMNS = ("TTFT p50 ms", "p90 ms", "p99 ms", "req/s", "tok/s", "device hits", "host hits", "storage hits", "failed")


def arm_row(scenario: str, arm: str, m: dict[str, Any]) -> str:
    vals = [cell(m.get("median_ttft_ms"), "ms"), cell(m.get("p90_ttft_ms"), "ms"), cell(m.get("p99_ttft_ms"), "ms"),
            cell(m.get("request_throughput"), "num"), cell(m.get("total_throughput"), "num"),
            cell(m.get("device_hit_rate"), "pct"), cell(m.get("host_hit_rate"), "pct"),
            cell(m.get("storage_hit_rate"), "pct"), cell(m.get("failed"), "ms")]
    return f"| {scenario} | {arm} | " + " | ".join(vals) + " |"


def ratio_line(name: str, scenario: dict[str, Any]) -> str:
    goals = scenario.get("goals", {})
    parts = []
    for key, value in scenario.get("ratios", {}).items():
        goal = goals.get(key)
        shown = "–" if value is None else f"{value:.2f}x"
        met = "" if goal is None or value is None else (" met" if value >= goal else " **not met**")
        parts.append(f"{key.replace('_', ' ')} {shown}" + (f" (goal ≥ {goal}x{met})" if goal else ""))
    return f"- **{name}**: " + "; ".join(parts)


def table(result: dict[str, Any]) -> str:
    """The per-arm table (medians of the repeats), each scenario's ratios against its goals, what did not run."""
    lines = ["| scenario | arm | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 2)]
    scenarios = result.get("scenarios", {})
    for name, scenario in scenarios.items():
        for arm, m in scenario.get("median", {}).items():
            lines.append(arm_row(name, arm, m))
    lines.append("")
    lines += [ratio_line(name, s) for name, s in scenarios.items() if s.get("ratios")]
    lines += [f"- **{name}** did not run: `{s['error']}`" for name, s in scenarios.items() if "error" in s]
    lines += [f"- **{arm}** did not run: {why}" for arm, why in result.get("arms_not_run", {}).items()]
    check = result.get("agreement") or {}
    for arm, a in check.get("arms", {}).items():
        lines.append(f"- outputs, {arm} (loaded from its store) vs hicache (plain prefill): tokens "
                     f"{'equal' if a['tokens_equal'] else '**differ**'}, first-token log-probability difference "
                     f"{a['first_token_logprob_difference']:.2g} (tolerance {check['tolerance']}), "
                     f"{a['tokens_loaded_from_storage']} tokens loaded")
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: serve_sglang_report.py RESULT_JSON")
    with open(sys.argv[1]) as f:
        print(table(json.load(f)), end="")


if __name__ == "__main__":
    main()
