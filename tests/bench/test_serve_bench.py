"""bench/serve.py without an engine: its traces, its arguments, the shim for the CPU build, its JSON and table.

The end-to-end run (`python -m bench.serve --quick`) starts several `vllm serve` processes (each a minute or
more on a small shared machine) and is not part of the test suite; docs/benchmarks/serve.md says how to run it.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bench import serve, serve_report
from bench.serve_engine import engine_env, error_line, make_shim, parse_metrics, peer_broken
from bench.serve_harness import FULL, QUICK, interleaved, median_of, summarize
from bench.serve_scenarios import CPU_BLOCK, working_set_trace
from bench.serve_traces import (
    Conversations,
    compress_time,
    conversation_slice,
    conversation_trace,
    halves,
    read_rows,
    scaled_slice,
    unique_trace,
    working_set_tokens,
    write_jsonl,
)

SMALL = Conversations(sessions=5, turns=4, systems=2, system_blocks=3, turn_blocks=2, block_tokens=64,
                      output_tokens=4, session_gap_ms=100, turn_gap_ms=1000, seed=3)


def by_session(rows: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in rows:
        out.setdefault(r["session"], []).append(r)
    return {s: sorted(v, key=lambda r: r["turn"]) for s, v in out.items()}


def test_conversations_grow_their_context_each_turn_after_a_shared_system_prompt():
    rows = conversation_trace(SMALL)
    assert len(rows) == SMALL.sessions * SMALL.turns
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    systems = set()
    for turns in by_session(rows).values():
        systems.add(tuple(turns[0]["hash_ids"][:SMALL.system_blocks]))
        for a, b in itertools.pairwise(turns):
            assert b["hash_ids"][:len(a["hash_ids"])] == a["hash_ids"]      # the whole earlier turn, then more
            assert len(b["hash_ids"]) == len(a["hash_ids"]) + SMALL.turn_blocks
            assert b["timestamp"] - a["timestamp"] == SMALL.turn_gap_ms
        for r in turns:
            assert r["input_length"] == len(r["hash_ids"]) * SMALL.block_tokens
            assert r["output_length"] == SMALL.output_tokens
    assert len(systems) <= SMALL.systems and max(r["input_length"] for r in rows) == SMALL.longest_prompt()
    assert working_set_tokens(rows, SMALL.block_tokens) <= SMALL.unique_tokens()


def test_hash_ids_are_prefix_chained_as_in_mooncake_traces():
    """Two requests share the id at a position only when they share every id before it."""
    rows = conversation_trace(SMALL)
    where: dict[int, tuple[int, ...]] = {}
    for r in rows:
        for i, h in enumerate(r["hash_ids"]):
            prefix = tuple(r["hash_ids"][:i])
            assert where.setdefault(h, prefix) == prefix


def test_the_generator_is_deterministic_and_checks_its_sizes():
    assert conversation_trace(SMALL) == conversation_trace(SMALL)
    with pytest.raises(ValueError, match="turns must be at least 1"):
        Conversations(turns=0)


def test_unique_prompts_share_no_block():
    rows = unique_trace(6, 3, 64, 4)
    ids = [h for r in rows for h in r["hash_ids"]]
    assert len(ids) == len(set(ids)) == 18
    assert working_set_tokens(rows, 64) == 18 * 64


def test_halves_start_at_time_zero_and_keep_every_request():
    rows = conversation_trace(SMALL)
    first, second = halves(rows)
    assert first[0]["timestamp"] == second[0]["timestamp"] == 0
    assert len(first) + len(second) == len(rows)
    assert [r["hash_ids"] for r in first + second] == [r["hash_ids"] for r in rows]


def mooncake_file(tmp_path: Path) -> Path:
    """A small trace in the shared trace's shape: two multi-turn conversations, one single request."""
    rows = [{"timestamp": 0, "input_length": 2000, "output_length": 300, "hash_ids": [0, 1, 2, 3]},
            {"timestamp": 0, "input_length": 900, "output_length": 5, "hash_ids": [0, 9]},
            {"timestamp": 3000, "input_length": 1500, "output_length": 40, "hash_ids": [0, 20, 21]},
            {"timestamp": 60000, "input_length": 9000, "output_length": 200, "hash_ids": [0, 1, 2, 3, 4, 5, 6]},
            {"timestamp": 90000, "input_length": 1900, "output_length": 7, "hash_ids": [0, 20, 21, 22]}]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_slice_keeps_multi_turn_conversations_and_fits_the_context(tmp_path):
    rows = conversation_slice(read_rows(str(mooncake_file(tmp_path)), 100), conversations=2)
    assert [r["hash_ids"][1] for r in rows] == [1, 20, 1, 20]        # the single request is left out
    scaled = compress_time(scaled_slice(rows, 512, 64, 5, 8, 1.0), 1000)
    assert [r["timestamp"] for r in scaled] == [0, 33, 667, 1000]
    for r in scaled:
        assert len(r["hash_ids"]) <= 5 and 1 <= r["input_length"] <= len(r["hash_ids"]) * 64
        assert r["output_length"] <= 8
    assert scaled[2]["hash_ids"] == [0, 1, 2, 3, 4]                   # cut at 5 blocks, the prefix kept
    assert scaled[0]["input_length"] == 250                           # 2000 tokens of 512-blocks, at 64 a block


def test_trace_files_round_trip_and_bad_rows_are_named(tmp_path):
    rows = conversation_trace(SMALL)
    path = write_jsonl(rows, str(tmp_path / "t.jsonl"))
    back = list(read_rows(path, 1000))
    assert [set(r) for r in back] == [{"timestamp", "input_length", "output_length", "hash_ids"}] * len(rows)
    assert [r["hash_ids"] for r in back] == [r["hash_ids"] for r in rows]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a trace row needs \['output_length', 'hash_ids'\]"):
        list(read_rows(str(bad), 10))


def test_the_working_set_is_four_times_a_cache_that_holds_the_requests_in_flight():
    for profile in (QUICK, FULL):
        c, blocks = working_set_trace(profile)
        longest = -(-(c.longest_prompt() + c.output_tokens) // CPU_BLOCK)
        assert blocks >= profile.ws_concurrency * longest
        assert c.unique_tokens() >= 4 * blocks * CPU_BLOCK * 0.95


def test_arguments_are_checked_with_one_clear_line(capsys):
    with pytest.raises(SystemExit, match="--scenarios: unknown \\['restrat'\\]; choose from restart,"):
        serve.parse_args(["--scenarios", "restart,restrat"])
    with pytest.raises(SystemExit):
        serve.parse_args(["--repeats", "0"])
    assert "argument --repeats: must be positive, got '0'" in capsys.readouterr().err
    args = serve.parse_args(["--quick", "--scenarios", "all_miss", "--repeats", "2"])
    assert args.scenarios == ["all_miss"]
    assert serve.profile_for(args).repeats == 2 and serve.profile_for(args).name == "quick"
    assert serve.profile_for(serve.parse_args([])) == FULL


def test_the_shim_gives_the_cpu_build_a_vllm_distribution(tmp_path):
    """The `vllm` console script's lookup of the distribution `vllm` finds the shim first on PYTHONPATH."""
    shim = make_shim(str(tmp_path / "shim"), "9.8.7")
    out = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                         env={**os.environ, "PYTHONPATH": shim}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "9.8.7"
    env = engine_env(str(tmp_path / "work"), shim)
    assert env["PYTHONPATH"].split(":")[0] == shim and env["VLLM_TARGET_DEVICE"] == "cpu"
    assert env["PYTHONHASHSEED"] == "0" and env["HOME"].startswith(str(tmp_path))


def test_a_pinned_hash_seed_gives_the_client_the_same_tokens_in_every_process():
    """vLLM's timed-trace client seeds a block's tokens with hash(f"{id}:{size}"): pinned, it repeats."""
    code = "print(hash('17:256') & 0xFFFFFFFF)"
    seen = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": "0"},
                           capture_output=True, text=True, check=True).stdout for _ in range(2)}
    assert len(seen) == 1


def test_metrics_and_hit_rates_come_from_counter_deltas():
    page = ('vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0\n'
            'vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e+09\n'
            'vllm:external_prefix_cache_queries_total{engine="0"} 600.0\n'
            'vllm:external_prefix_cache_hits_total{engine="0"} 300.0\n'
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 200.0\n'
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 100.0\n'
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 100.0\n')
    after = parse_metrics(page)
    assert after["prefix_cache_queries"] == 1000 and after["prefix_cache_hits"] == 250
    before = dict.fromkeys(after, 0.0) | {"prefix_cache_queries": 200.0, "prefix_cache_hits": 50.0}
    client = {"completed": 4, "request_throughput": 2.0, "p50_ttft_ms": 10.0, "p90_ttft_ms": 20.0,
              "p99_ttft_ms": 30.0}
    s = summarize(client, before, after, {"hit_tokens": 0, "lookup_tokens": 100},
                  {"hit_tokens": 75, "lookup_tokens": 200})
    assert s["vllm_hit_rate"] == 0.25 and s["external_hit_rate"] == 0.5 and s["daemon_hit_rate"] == 0.75
    assert after["prompt_tokens_local_compute"] == 200 and s["token_hit_rate"] == 0.5   # (100 + 100) / 400
    assert summarize(client, after, after, None, None)["vllm_hit_rate"] is None
    assert "daemon_hit_rate" not in summarize(client, before, after, None, None)


def test_repeats_are_interleaved_and_reduced_to_medians():
    assert interleaved(["a", "b", "c"], 4) == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    m = median_of([{"x": 1.0, "y": None}, {"x": 3.0, "y": None}, {"x": 2.0, "y": None}])
    assert m == {"x": 2.0, "y": None}


def test_a_failed_start_is_reported_by_its_error_line():
    log = ("(APIServer pid=1) INFO 12-02 starting\n"
           "(EngineCore pid=2) Traceback (most recent call last):\n"
           "(EngineCore pid=2)   File \"x.py\", line 1\n"
           "(EngineCore pid=2) ValueError: CPU Offloading is currently only supported on CUDA-alike and XPU GPUs\n"
           "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert error_line(log) == ("ValueError: CPU Offloading is currently only supported on CUDA-alike and "
                               "XPU GPUs")
    lmcache = ("\x1b[31;20m[2026-12-02 07:01:53,821] LMCache ERROR:\x1b[0m Failed to initialize LMCacheManager "
               "components: Traceback (most recent call last):\n  File \"x.py\", line 9, in f\n"
               "RuntimeError: No supported cpu connector found.\nINFO: Application startup complete.\n")
    assert peer_broken(lmcache) == ("Failed to initialize LMCacheManager components: "
                                    "RuntimeError: No supported cpu connector found.")
    assert peer_broken(log) is None


def test_the_table_shows_every_arm_and_each_ratio_against_its_goal():
    result = {"scenarios": {"restart": {
        "median": {"kvstore": {"p50_ttft_ms": 120.0, "p90_ttft_ms": 300.0, "p99_ttft_ms": 410.0,
                               "request_throughput": 3.2, "total_token_throughput": 6400.0,
                               "vllm_hit_rate": 0.1, "daemon_hit_rate": 0.8},
                   "vllm_restarted": {"p50_ttft_ms": 500.0, "request_throughput": 1.6, "vllm_hit_rate": 0.3}},
        "ratios": {"kvstore_vs_restarted": 2.0}, "goals": {"kvstore_vs_restarted": 1.5},
        "peers_not_run": {"lmcache": "ImportError: no CUDA"}}}}
    text = serve_report.table(result)
    assert "| restart | kvstore | 120 | 300 | 410 | 3.20 | 6400 | 10% | 80% |" in text
    assert "| restart | vllm_restarted | 500 | – | – | 1.60 | – | 30% | – |" in text
    assert "kvstore vs restarted 2.00x (goal ≥ 1.5x)" in text
    assert "**lmcache** did not run: `ImportError: no CUDA`" in text


def test_jitter_moves_arrivals_but_never_a_turn_before_the_previous_one():
    jittered = replace(SMALL, jitter_ms=900)
    rows = conversation_trace(jittered)
    assert rows == conversation_trace(jittered)                               # seeded
    plain = {(r["session"], r["turn"]): r["timestamp"] for r in conversation_trace(SMALL)}
    moved = {(r["session"], r["turn"]): r["timestamp"] - plain[(r["session"], r["turn"])] for r in rows}
    assert all(0 <= m <= 900 for m in moved.values()) and len(set(moved.values())) > 1
    for turns in by_session(rows).values():
        assert [r["turn"] for r in turns] == sorted(r["turn"] for r in turns)
        assert all(a["timestamp"] < b["timestamp"] for a, b in itertools.pairwise(turns))
    with pytest.raises(ValueError, match=r"jitter_ms \(1000\) must be below turn_gap_ms \(1000\)"):
        replace(SMALL, jitter_ms=1000)


def test_the_routing_table_shows_token_hits_and_a_goal_to_stay_under():
    result = {"scenarios": {"routing": {
        "median": {"events": {"p50_ttft_ms": 100.0, "token_hit_rate": 0.8}},
        "ratios": {"p50_ttft_ms_events_vs_round_robin": 0.5, "token_hit_rate_events_vs_round_robin": 1.6},
        "goals": {"p50_ttft_ms_events_vs_round_robin": 0.6, "token_hit_rate_events_vs_round_robin": 1.8},
        "goal_directions": {"p50_ttft_ms_events_vs_round_robin": "<="}}}}
    text = serve_report.table(result)
    assert "| routing | events | 100 | – | – | – | – | – | – | 80% |" in text
    assert "p50 ttft ms events vs round robin 0.50x (goal ≤ 0.6x)" in text
    assert "token hit rate events vs round robin 1.60x (goal ≥ 1.8x)" in text


def test_routing_engines_hold_two_of_the_longest_requests():
    from bench.serve_routing import FULL_TRACE, engine_blocks, parse_args

    blocks = engine_blocks(FULL_TRACE)
    assert (blocks - 1) * CPU_BLOCK >= 2 * (FULL_TRACE.longest_prompt() + FULL_TRACE.output_tokens)
    assert blocks * CPU_BLOCK < FULL_TRACE.unique_tokens() / 2    # less than an engine's share of the trace
    assert parse_args(["--repeats", "2"]).scenarios == ["routing"]


def test_the_affinity_ceiling_counts_leading_blocks_held_by_the_engine_chosen():
    from bench.serve_routing import affinity_ceiling

    rows = [{"session": 0, "hash_ids": [0, 1]}, {"session": 1, "hash_ids": [0, 2]},
            {"session": 0, "hash_ids": [0, 1, 3]}, {"session": 1, "hash_ids": [0, 2, 4]}]
    got = affinity_ceiling(rows)
    # round robin: e0, e1, e0, e1 is session affinity here; both find the earlier turn on their engine
    assert got == {"round_robin": 4 / 10, "session_affinity": 4 / 10, "ratio": 1.0}
    swapped = [rows[0], rows[1], rows[3], rows[2]]   # round robin now sends each follow-up to the other engine
    got = affinity_ceiling(swapped)
    assert got["round_robin"] == 2 / 10 and got["session_affinity"] == 4 / 10 and got["ratio"] == 2.0


def test_the_affinity_ceiling_at_a_daemon_size_drops_least_recently_used_blocks():
    from bench.serve_routing import affinity_ceiling

    rows = [{"session": 0, "hash_ids": [0, 1]}, {"session": 1, "hash_ids": [5, 6]},
            {"session": 0, "hash_ids": [0, 1, 2]}]
    assert affinity_ceiling(rows, engines=1)["round_robin"] == 2 / 7   # the follow-up finds its first turn
    # a daemon of 2 blocks keeps only the second session's: the follow-up finds nothing
    assert affinity_ceiling(rows, engines=1, capacity=2)["round_robin"] == 0.0
    assert affinity_ceiling(rows, engines=1, capacity=4)["round_robin"] == 2 / 7


def test_the_prefill_ceiling_is_the_median_of_the_tokens_each_request_must_prefill():
    from bench.serve_routing import prefill_ceiling

    # two sessions of two turns; round robin sends each follow-up to the other engine, which holds nothing of it
    rows = [{"session": 0, "hash_ids": [0, 1], "input_length": 2 * 256},
            {"session": 1, "hash_ids": [0, 2], "input_length": 2 * 256},
            {"session": 1, "hash_ids": [0, 2, 4], "input_length": 3 * 256 + 10},
            {"session": 0, "hash_ids": [0, 1, 3], "input_length": 3 * 256 + 10}]
    got = prefill_ceiling(rows, 256)
    # round robin: 512, 512 (the system block is on e0 only), 522 (e0 holds block 0), 522 -> median 517
    # affinity: 512, 512, 266, 266 -> median 389
    assert got == {"round_robin_p50_tokens": 517, "session_affinity_p50_tokens": 389, "ratio": 389 / 517}
