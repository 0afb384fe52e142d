"""A quick or redirected benchmark run never rewrites the committed results under bench/results/; a full run
replaces the one file of its benchmark there, ``NAME-latest.json``."""

from __future__ import annotations

import json
import os
import re

from bench import _common

BENCH = _common.BENCH_DIR


def results_listing() -> dict[str, float]:
    return {name: os.stat(os.path.join(_common.RESULTS_DIR, name)).st_mtime for name in os.listdir(_common.RESULTS_DIR)}


def test_quick_and_out_results_go_elsewhere(tmp_path):
    before = results_listing()
    quick = _common.write_result("selftest", {"x": 1}, quick=True)
    out = _common.write_result("selftest", {"x": 2}, out=str(tmp_path / "r.json"))
    try:
        assert results_listing() == before
        assert not quick.startswith(_common.RESULTS_DIR) and json.load(open(quick))["quick"] is True
        assert out == str(tmp_path / "r.json") and json.load(open(out))["x"] == 2
    finally:
        os.unlink(quick)


def test_a_full_run_replaces_the_latest_result_and_keeps_no_other(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "RESULTS_DIR", str(tmp_path / "results"))
    first = _common.write_result("selftest", {"x": 1})
    second = _common.write_result("selftest", {"x": 2})
    assert first == second == str(tmp_path / "results" / "selftest-latest.json")
    assert os.listdir(tmp_path / "results") == ["selftest-latest.json"]
    assert json.load(open(second))["x"] == 2


def test_every_benchmark_with_quick_passes_it_on():
    """A script that has --quick must hand it to write_result (or write nothing in --quick)."""
    for name in sorted(os.listdir(BENCH)):
        if not name.endswith(".py"):
            continue
        source = open(os.path.join(BENCH, name)).read()
        if '"--quick"' not in source:
            continue
        for call in re.findall(r"write_result\([^)]*\)", source):
            assert "quick" in call or "if not args.quick" in source, f"bench/{name}: {call}"


def test_abba_blocks_cancel_the_order_of_rounds():
    """A side run right after itself is slower (it pays for what it left behind): one ratio per round counts that
    as the difference between the sides, one per A B, B A block does not."""
    true_ratio, penalty = 0.95, 0.9
    a, b = [], []
    for i in range(8):
        if _common.abba_first(i):   # A follows A (the previous block's last round), B follows A
            a.append(true_ratio * penalty)
            b.append(1.0)
        else:                       # B follows B, A follows B
            b.append(penalty)
            a.append(true_ratio)
    per_round = [x / y for x, y in zip(a, b)]
    assert min(per_round) < 0.86 and max(per_round) > 1.05
    assert all(abs(r - true_ratio) < 1e-12 for r in _common.abba_ratios(a, b))
    assert len(_common.abba_ratios(a[:7], b[:7])) == 3   # a round without its pair is left out
