"""Capacity planner: trace replay through the real Store — synthetic traces with known answers, a slice of the
Mooncake trace against an independent computation, the CLI, and each eviction policy in a running daemon."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from kvstore.sim.replay import Capacity, block_key, hit_tokens_by_tier, replay, unbounded
from kvstore.sim.trace import Request, distinct_blocks, read_trace
from kvstore.store.policies import POLICIES

from harness import daemons

TRACE = "/work/shared/traces/conversation_trace.jsonl"
CHUNK = 1 << 20
SLICE = 500


def req(ids: list[int], length: int | None = None) -> Request:
    return Request(0, length if length is not None else 512 * len(ids), 0, tuple(ids))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return daemons.run_cli(*args, timeout=120)


@pytest.fixture(scope="module")
def trace_slice() -> list[Request]:
    if not os.path.exists(TRACE):
        pytest.skip(f"{TRACE} not present")
    return read_trace(TRACE, SLICE)


def ceiling_by_hand(requests: list[Request]) -> float:
    """Unbounded token hit rate computed without the Store: a set of every block seen so far."""
    seen: set[int] = set()
    hit = total = 0
    for r in requests:
        n = 0
        for b in r.hash_ids:
            if b not in seen:
                break
            n += 1
        hit += min(512 * n, r.input_length)
        total += r.input_length
        seen.update(r.hash_ids)
    return hit / total


# -- synthetic traces with known answers ---------------------------------------------------------------------
def test_unbounded_counts_leading_blocks_and_partial_last_block():
    trace = [req([1, 2, 3], 1536), req([1, 2, 4], 1200), req([1, 2, 3], 1400)]
    result = unbounded(trace, CHUNK)
    assert result.hit_tokens == {"host": 0 + 1024 + 1400, "disk": 0}
    assert result.input_tokens == 1536 + 1200 + 1400
    assert result.hit_rate() == pytest.approx(2424 / 4136)


def test_continuations_are_evicted_before_prefixes():
    trace = [req([1, 2, 3]), req([4, 5]), req([1, 2, 3])]
    cap = Capacity(3 * CHUNK, 0, CHUNK)
    # chain-lru evicts 3 then 2 for the second request: the third still finds block 1.
    assert replay(trace, cap, "chain-lru").hit_tokens["host"] == 512
    # plain LRU evicts the prefix 1 and 2 first, stranding 3: nothing is found.
    assert replay(trace, cap, "lru").hit_tokens["host"] == 0


def test_disk_tier_serves_what_dram_demoted_and_splits_tokens_by_tier():
    cap = Capacity(2 * CHUNK, 10 * (CHUNK + 4096), CHUNK)
    trace = [req([1, 2]), req([3, 4]), req([1, 2]), req([1, 2], 1000)]
    result = replay(trace, cap)
    # The third request finds both blocks on disk (DRAM made room for 3 and 4); its lookup promotes block 1
    # (the promotion budget is half the host tier), so the fourth finds 1 in DRAM and 2 on disk.
    assert result.hit_tokens == {"host": 512, "disk": 1024 + 488}
    assert result.promotions >= 1 and result.demotions >= 2


def test_gpu_tier_serves_chunks_hit_twice():
    cap = Capacity(8 * CHUNK, 0, CHUNK, gpu_bytes=4 * CHUNK)
    trace = [req([1, 2]), req([1, 2]), req([1, 2]), req([3, 4]), req([1, 2])]
    result = replay(trace, cap)
    # First request stores 1, 2 in DRAM; the second hits them in DRAM (a first hit), the third in DRAM again
    # (second hit: promoted to the GPU tier after it), and the last finds them in the GPU tier.
    assert result.hit_tokens == {"gpu": 1024, "host": 2048, "disk": 0}
    assert set(replay(trace, Capacity(8 * CHUNK, 0, CHUNK)).hit_tokens) == {"host", "disk"}


def test_gpu_tier_demotes_past_its_watermark_without_losing_chunks():
    cap = Capacity(16 * CHUNK, 0, CHUNK, gpu_bytes=2 * CHUNK)
    chains = [[10 * i + 1, 10 * i + 2] for i in range(4)]
    trace = [req(c) for c in chains for _ in range(3)] + [req(c) for c in chains]
    result = replay(trace, cap)
    # Every chain is found in full on its last visit: in the GPU tier or, demoted, still in DRAM.
    assert result.hit_tokens["gpu"] + result.hit_tokens["host"] == 4 * 2 * 512 + 4 * 2 * 2 * 512
    assert result.hit_tokens["gpu"] > 0 and result.evictions == 0


def test_s3fifo_keeps_a_reused_chunk_through_a_scan_of_one_off_chunks():
    cap = Capacity(10 * CHUNK, 0, CHUNK)
    hot = [req([0]), req([0])]
    scan = [req([100 + i]) for i in range(30)]
    trace = hot + scan + [req([0])]
    assert replay(trace, cap, "s3-fifo").hit_tokens["host"] == 2 * 512
    assert replay(trace, cap, "chain-lru").hit_tokens["host"] == 512


def test_a_request_larger_than_dram_is_counted_not_fatal():
    result = replay([req([1, 2, 3, 4]), req([1, 2])], Capacity(2 * CHUNK, 0, CHUNK))
    assert result.put_failures == 1 and result.hit_tokens["host"] == 0


def test_tokens_by_tier_takes_the_partial_block_off_the_last_tier():
    assert hit_tokens_by_tier(["host", "disk"], 700) == {"host": 512, "disk": 188}
    assert hit_tokens_by_tier(["disk", "host"], 5000) == {"host": 512, "disk": 512}
    assert hit_tokens_by_tier([], 100) == {}
    assert block_key(-1) != block_key(1)


# -- a slice of the Mooncake conversation trace ----------------------------------------------------------------
def test_slice_unbounded_matches_an_independent_computation(trace_slice):
    assert unbounded(trace_slice, CHUNK).hit_rate() == pytest.approx(ceiling_by_hand(trace_slice), abs=1e-12)


def test_slice_hit_rate_grows_with_capacity_to_the_ceiling(trace_slice):
    blocks = distinct_blocks(trace_slice)
    ceiling = ceiling_by_hand(trace_slice)
    for policy in POLICIES:
        rates = [replay(trace_slice, Capacity(int(blocks * f) * CHUNK, 0, CHUNK), policy).hit_rate()
                 for f in (0.05, 0.3, 1.0)]
        assert rates[0] <= rates[1] <= rates[2] == pytest.approx(ceiling), policy
        assert rates[0] < ceiling


def test_slice_disk_tier_adds_hits_beyond_dram(trace_slice):
    blocks = distinct_blocks(trace_slice)
    host_only = replay(trace_slice, Capacity(blocks // 20 * CHUNK, 0, CHUNK))
    tiered = replay(trace_slice, Capacity(blocks // 20 * CHUNK, blocks // 5 * (CHUNK + 4096), CHUNK))
    assert tiered.hit_rate("disk") > 0
    assert tiered.hit_rate() > host_only.hit_rate()


# -- the command line ------------------------------------------------------------------------------------------
def test_cli_json_reports_each_tier_and_the_ceiling(trace_slice, tmp_path):
    blocks = distinct_blocks(trace_slice)
    result = run_cli("simulate", TRACE, "--limit", str(SLICE), "--chunk-bytes", "1MiB",
                     "--host-mem", f"{blocks // 20}MiB", "--disk-size", f"{blocks // 5 * 2}MiB", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["requests"] == SLICE and report["distinct_blocks"] == blocks
    assert report["unbounded_hit_rate"] == pytest.approx(ceiling_by_hand(trace_slice), abs=1e-5)
    (row,) = report["results"]
    assert row["policy"] == "chain-lru"
    assert row["hit_rate"]["total"] == pytest.approx(row["hit_rate"]["host"] + row["hit_rate"]["disk"], abs=2e-5)
    assert 0 < row["hit_rate"]["total"] <= report["unbounded_hit_rate"]


def test_cli_sweep_draws_a_png(tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": i, "input_length": 1024, "output_length": 1, "hash_ids": [i % 7, 100 + i % 13]}
            for i in range(200)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "sweep.png"
    result = run_cli("simulate", str(trace), "--chunk-bytes", "1MiB", "--host-mem", "4MiB", "--sweep",
                     "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "unbounded" in result.stdout and "plot:" in result.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def big_trace(tmp_path) -> str:
    """Enough requests that a sweep takes many seconds: a check that fails fast has to come first."""
    trace = tmp_path / "big.jsonl"
    rows = [{"timestamp": i, "input_length": 512 * 8, "output_length": 1, "hash_ids": list(range(i, i + 8))}
            for i in range(20000)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(trace)


def test_cli_sweep_without_matplotlib_names_the_extra_before_any_work(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", ""), os.getcwd()])}
    result = daemons.run_cli("simulate", big_trace(tmp_path), "--chunk-bytes", "1MiB", "--host-mem", "4MiB",
                             "--sweep", "--out", str(tmp_path / "sweep.png"), env=env, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "kvstore: error: --sweep draws its plot with matplotlib, which is not installed: "
        "pip install 'kvstore[sim]' (or drop --sweep)"]
    assert not (tmp_path / "sweep.png").exists()   # no replay ran, nothing was drawn


def test_cli_sweep_into_a_missing_directory_fails_before_any_work(tmp_path):
    out = tmp_path / "no" / "such" / "sweep.png"
    result = run_cli("simulate", big_trace(tmp_path), "--chunk-bytes", "1MiB", "--host-mem", "4MiB", "--sweep",
                     "--out", str(out))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (f"kvstore: error: --out: directory {out.parent} does not exist; "
                                     f"create it or give another path")


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('{"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [1]}', "cannot hold input_length"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": "1,2"}', "hash_ids must be a list"),
    ('{"timestamp": 0, "output_length": 1, "hash_ids": [1]}', "missing 'input_length'"),
])
def test_cli_names_the_bad_trace_line(tmp_path, line, message):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n' + line + "\n")
    result = run_cli("simulate", str(trace), "--chunk-bytes", "1MiB", "--host-mem", "4MiB")
    assert result.returncode == 2
    assert "bad.jsonl:2: " in result.stderr and message in result.stderr


@pytest.mark.parametrize("flags, message", [
    (["--host-mem", "1MiB", "--chunk-bytes", "2MiB"], "cannot hold one"),
    (["--host-mem", "4MiB", "--chunk-bytes", "1MiB", "--gpu-mem", "100KiB"], "--gpu-mem"),
    (["--host-mem", "lots", "--chunk-bytes", "1MiB"], "--host-mem"),
])
def test_cli_refuses_bad_sizes(tmp_path, flags, message):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    result = run_cli("simulate", str(trace), *flags)
    assert result.returncode == 2 and message in result.stderr


def test_cli_missing_trace():
    result = run_cli("simulate", "/nonexistent/trace.jsonl", "--chunk-bytes", "1MiB", "--host-mem", "4MiB")
    assert result.returncode == 2 and "does not exist" in result.stderr


# -- every policy runs in the daemon ---------------------------------------------------------------------------
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_daemon_runs_each_policy(start_daemon, policy):
    d = start_daemon("--host-mem", "4MiB", "--disk-size", "0", "--eviction-policy", policy)
    with d.client(namespace="t", chunk_tokens=4) as c:
        for round_ in range(6):   # six 2-chunk chains into a 4-chunk tier
            keys = c.chunk_keys([round_] * 8)
            c.put(keys, [bytes([round_]) * (1 << 20)] * 2)
            assert c.lookup(keys) == 2
            with c.get(keys) as views:
                assert bytes(views[1][:1]) == bytes([round_])
        assert c.stats()["counters"]["evictions"] >= 8


def test_daemon_refuses_an_unknown_policy(start_daemon):
    d = start_daemon("--eviction-policy", "random", wait=False)
    assert d.proc.wait(30) == 2
    assert "chain-lru, lru, s3-fifo" in d.log()


def test_help():
    result = run_cli("simulate", "--help")
    assert result.returncode == 0 and "--chunk-bytes" in result.stdout


def test_a_trace_with_tenants_reports_each_tenants_hit_rate(tmp_path):
    from kvstore.sim.replay import Capacity, replay
    from kvstore.sim.trace import Request
    from kvstore.tenants import parse_tenants

    chunk = 4096
    table = parse_tenants({"a": {"namespaces": ["x"], "dram": {"guaranteed": 4 * chunk}}}, "t.toml")
    requests = []
    for i in range(40):   # a repeats one 4-block prompt; b sends a new 4-block prompt each time
        requests.append(Request(0, 2048, 1, (1, 2, 3, 4), "a"))
        requests.append(Request(0, 2048, 1, tuple(range(100 + 4 * i, 104 + 4 * i)), "b"))
    guarded = replay(requests, Capacity(6 * chunk, 0, chunk), tenants=table).to_json()["tenants"]
    shared = replay(requests, Capacity(6 * chunk, 0, chunk)).to_json()["tenants"]
    assert guarded["a"]["hit_rate"] == pytest.approx(39 / 40)
    assert shared["a"]["hit_rate"] < guarded["a"]["hit_rate"]
    assert guarded["default"]["hit_rate"] == 0 and guarded["a"]["evicted_by_others"] == 0   # b: not in the table
