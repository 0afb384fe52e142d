"""The markdown table of a `bench/serve.py` result (docs/benchmarks/serve.md quotes it).

    python -m bench.serve_report bench/results/serve-latest.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

COLUMNS = ("TTFT p50 ms", "p90 ms", "p99 ms", "req/s", "tok/s", "vLLM hits", "daemon hits", "token hits")


def cell(value: Any, kind: str) -> str:
    if value is None:
        return "–"
    if kind == "pct":
        return f"{100 * value:.0f}%"
    if kind == "ms":
        return f"{value:.0f}"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def arm_row(scenario: str, arm: str, m: dict[str, Any]) -> str:
    vals = [cell(m.get("p50_ttft_ms"), "ms"), cell(m.get("p90_ttft_ms"), "ms"), cell(m.get("p99_ttft_ms"), "ms"),
            cell(m.get("request_throughput"), "num"), cell(m.get("total_token_throughput"), "num"),
            cell(m.get("vllm_hit_rate"), "pct"), cell(m.get("daemon_hit_rate"), "pct"),
            cell(m.get("token_hit_rate"), "pct")]
    return f"| {scenario} | {arm} | " + " | ".join(vals) + " |"


def ratio_line(name: str, scenario: dict[str, Any]) -> str:
    goals, directions = scenario.get("goals", {}), scenario.get("goal_directions", {})
    parts = []
    for key, value in scenario.get("ratios", {}).items():
        goal = goals.get(key)
        shown = "–" if value is None else f"{value:.2f}x"
        sign = "≤" if directions.get(key) == "<=" else "≥"
        parts.append(f"{key.replace('_', ' ')} {shown}" + (f" (goal {sign} {goal}x)" if goal else ""))
    return f"- **{name}**: " + "; ".join(parts)


def table(result: dict[str, Any]) -> str:
    """The per-arm table (medians of the repeats), then each scenario's ratios against its goals."""
    lines = ["| scenario | arm | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 2)]
    for name, scenario in result.get("scenarios", {}).items():
        for arm, m in scenario.get("median", {}).items():
            lines.append(arm_row(name, arm, m))
    lines.append("")
    lines += [ratio_line(name, s) for name, s in result.get("scenarios", {}).items() if s.get("ratios")]
    not_run = {k: v for s in result.get("scenarios", {}).values() for k, v in s.get("peers_not_run", {}).items()}
    for peer, error in not_run.items():
        lines.append(f"- **{peer}** did not run: `{error}`")
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: serve_report.py RESULT_JSON")
    with open(sys.argv[1]) as f:
        print(table(json.load(f)), end="")


if __name__ == "__main__":
    main()
