"""bench/serve_sglang.py without an engine: its arguments, traces and pool sizes, each arm's SGLang flags, the
bench model's tokenizer on SGLang's client prompts, the client's figures, and the table docs/benchmarks quotes.

The end-to-end run (`python -m bench.serve_sglang --quick`) starts four SGLang servers (minutes each on a small
shared machine) and is not part of the test suite; docs/benchmarks/serve-sglang.md says how to run it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from bench import serve_sglang, serve_sglang_report
from bench.serve_sglang import (
    CLIENT_BLOCK_TOKENS,
    FULL,
    QUICK,
    longest_request,
    trace_rows,
    working_set_rows,
    working_set_tokens,
)
from bench.serve_sglang_engine import ARMS, EngineShape, base_flags, client_argv, storage_flags, summarize

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "bench" / "results" / "serve-sglang-latest.json"
DOC = REPO / "docs" / "benchmarks" / "serve-sglang.md"


def mooncake_trace(tmp_path: Path, conversations: int = 40) -> str:
    """A Mooncake-format trace of multi-turn conversations: a shared first hash id, each turn extending the last."""
    rows, next_id = [], 1
    for c in range(conversations):
        ids = [0, *range(next_id, next_id + 4)]
        next_id += 4
        for turn in range(3):
            rows.append({"timestamp": 1000 * c + 30000 * turn, "input_length": 512 * len(ids), "output_length": 50,
                         "hash_ids": list(ids)})
            ids += list(range(next_id, next_id + 3))
            next_id += 3
    rows.sort(key=lambda r: r["timestamp"])
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_arguments_are_checked_with_one_clear_line(capsys):
    with pytest.raises(SystemExit, match=r"--scenarios: unknown \['restrat'\]; choose from restart,"):
        serve_sglang.parse_args(["--scenarios", "restart,restrat"])
    with pytest.raises(SystemExit, match="hicache and kvstore are needed"):
        serve_sglang.parse_args(["--arms", "file,mooncake"])
    with pytest.raises(SystemExit):
        serve_sglang.parse_args(["--repeats", "0"])
    assert "argument --repeats: must be positive, got '0'" in capsys.readouterr().err
    args = serve_sglang.parse_args(["--quick", "--arms", "kvstore,hicache", "--repeats", "2"])
    assert args.arms == ["hicache", "kvstore"] and args.scenarios == list(serve_sglang.SCENARIOS)
    assert serve_sglang.profile_for(args) == QUICK.__class__(**{**QUICK.__dict__, "repeats": 2})
    assert serve_sglang.profile_for(serve_sglang.parse_args([])) == FULL


def test_every_pool_holds_the_requests_in_flight_and_the_working_set_is_four_pools(tmp_path):
    path = mooncake_trace(tmp_path)
    for profile in (QUICK, FULL):
        assert profile.concurrency * longest_request(profile) <= profile.pool_tokens
        assert profile.check_length - 2 * profile.page >= 256      # SGLang asks storage past 256 new tokens
        rows, n = working_set_rows(path, profile)
        assert working_set_tokens(rows) >= profile.pool_tokens / profile.kv_fraction
        assert working_set_tokens(trace_rows(path, n - 1, profile, 1000)) < profile.pool_tokens / profile.kv_fraction
        assert max(len(r["hash_ids"]) for r in rows) <= profile.max_blocks
        assert rows[-1]["timestamp"] == profile.ws_span_ms and rows[0]["timestamp"] == 0


def test_each_arm_differs_only_in_its_storage_backend():
    class Cluster:
        master_address, metadata = "127.0.0.1:5000", "http://127.0.0.1:5001/metadata"

    shape = EngineShape(page=16, pool_tokens=4096, hicache_ratio=2.0, max_running=8)
    base = base_flags(shape)
    for flag in ("--enable-hierarchical-cache", "--disable-overlap-schedule"):
        assert flag in base
    assert base[base.index("--hicache-mem-layout") + 1] == "layer_first"
    assert base[base.index("--hicache-io-backend") + 1] == "direct"
    assert base[base.index("--max-total-tokens") + 1] == "4096" and base[base.index("--page-size") + 1] == "16"
    assert "--skip-tokenizer-init" not in base          # the client sends text
    stores = {"file": "/tmp/files", "mooncake": Cluster(), "kvstore": "ipc:///tmp/kv.sock"}
    flags = {arm: storage_flags(arm, stores.get(arm)) for arm in ARMS}
    assert flags["hicache"] == []
    config = {arm: json.loads(f[f.index("--hicache-storage-backend-extra-config") + 1])
              for arm, f in flags.items() if f}
    assert [f[1] for f in flags.values() if f] == ["file", "mooncake", "dynamic"]
    assert config["file"] == {"file_storage_path": "/tmp/files"}
    assert config["mooncake"]["master_server_address"] == "127.0.0.1:5000"
    assert config["mooncake"]["global_segment_size"] == 0 and config["mooncake"]["protocol"] == "tcp"
    # kvstore's backend as docs/connectors/sglang.md configures it
    assert config["kvstore"]["module_path"] == "kvstore.connectors.sglang"
    assert config["kvstore"]["class_name"] == "KVStoreHiCacheStorage" and config["kvstore"]["interface_v1"] == 1
    assert config["kvstore"]["address"] == "ipc:///tmp/kv.sock"
    assert config["kvstore"]["reset_on_flush"] is False   # the scenarios' `/flush_cache` must not move the keys
    with pytest.raises(ValueError, match="unknown arm 'lmcache'"):
        storage_flags("lmcache", None)


def test_the_bench_tokenizer_gives_each_hash_id_of_a_client_prompt_its_own_tokens(tmp_path):
    """SGLang's client writes a hash id as its digits and then `hi` 128 times: with digits and `hi` as words, two
    rows share tokens exactly as far as they share hash ids, and a hash id is about CLIENT_BLOCK_TOKENS tokens."""
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from bench.serve_model import save_tokenizer

    save_tokenizer(str(tmp_path), 512, digit_words=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))

    def prompt(ids: list[int]) -> list[int]:   # sglang.benchmark.datasets.mooncake, one round, no chat template
        text = "".join(f"{h}" + " ".join(["hi"] * 128) for h in ids) + "Tell me a story based on this context."
        return tok.encode(f"user: Round 1: {text}")

    a, b = prompt([0, 14, 15]), prompt([0, 14, 16])
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert 0 not in a[5:-8]                       # no unknown word inside the blocks
    assert abs(shared - len(prompt([0, 14])) + 8) <= 2
    assert abs(len(prompt([0, 14, 15])) - len(prompt([0, 14])) - CLIENT_BLOCK_TOKENS) <= 2


def test_the_client_replays_the_rows_as_sglang_bench_serving_does_a_mooncake_trace():
    argv = client_argv("http://127.0.0.1:30000", "/m", "/t.jsonl", 12, 2, "/out.jsonl")
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert pairs["--dataset-name"] == "mooncake" and pairs["--dataset-path"] == "/t.jsonl"
    assert pairs["--mooncake-num-rounds"] == "1" and pairs["--mooncake-slowdown-factor"] == "1"
    assert pairs["--num-prompts"] == "12" and pairs["--max-concurrency"] == "2" and pairs["--backend"] == "sglang"
    assert pairs["--warmup-requests"] == "0" and "--cache-report" in argv   # caches filled by the trace alone


def test_the_client_record_becomes_throughput_ttft_and_hits_by_tier():
    record = {"completed": 9, "duration": 3.0, "request_throughput": 3.0, "total_throughput": 900.0,
              "median_ttft_ms": 120.0, "p99_ttft_ms": 400.0,
              "cache_report": {"total_prompt_tokens": 1000, "total_cached_tokens": 600, "device_cached_tokens": 100,
                               "host_cached_tokens": 200, "storage_cached_tokens": 300}}
    s = summarize(record, 10)
    assert s["failed"] == 1 and s["request_throughput"] == 3.0 and s["median_ttft_ms"] == 120.0
    assert (s["device_hit_rate"], s["host_hit_rate"], s["storage_hit_rate"], s["token_hit_rate"]) == (
        0.1, 0.2, 0.3, 0.6)
    assert summarize({"completed": 1, "cache_report": {"storage_cached_tokens": None}}, 1)["storage_hit_rate"] is None


def test_ratios_compare_kvstore_with_every_arm_in_throughput_and_ttft():
    out = {"median": {"kvstore": {"request_throughput": 3.0, "median_ttft_ms": 100.0},
                      "file": {"request_throughput": 1.5, "median_ttft_ms": 300.0},
                      "mooncake": {"request_throughput": 3.0, "median_ttft_ms": 90.0},
                      "hicache": {"request_throughput": None, "median_ttft_ms": 500.0}}}
    serve_sglang.ratios(out, list(ARMS))
    assert out["ratios"]["request_throughput_kvstore_vs_file"] == 2.0
    assert out["ratios"]["ttft_speedup_kvstore_vs_file"] == 3.0
    assert out["ratios"]["ttft_speedup_kvstore_vs_mooncake"] == 0.9
    assert out["ratios"]["request_throughput_kvstore_vs_hicache"] is None
    assert out["goals"] == {"request_throughput_kvstore_vs_file": 1.5, "ttft_speedup_kvstore_vs_file": 1.5,
                            "request_throughput_kvstore_vs_mooncake": 1.0, "ttft_speedup_kvstore_vs_mooncake": 1.0}
    text = serve_sglang_report.ratio_line("restart", out)
    assert "request throughput kvstore vs file 2.00x (goal ≥ 1.5x met)" in text
    assert "ttft speedup kvstore vs mooncake 0.90x (goal ≥ 1.0x **not met**)" in text


def test_the_table_shows_every_arm_and_what_did_not_run():
    result = {"scenarios": {"all_miss": {"median": {"kvstore": {
        "median_ttft_ms": 120.0, "p90_ttft_ms": 300.0, "p99_ttft_ms": 410.0, "request_throughput": 3.2,
        "total_throughput": 6400.0, "device_hit_rate": 0.0, "host_hit_rate": 0.0, "storage_hit_rate": 0.0,
        "failed": 0}}}, "working_set": {"error": "RuntimeError: boom"}},
        "arms_not_run": {"mooncake": "not installed"},
        "agreement": {"tolerance": 1e-3, "arms": {"kvstore": {
            "tokens_equal": True, "first_token_logprob_difference": 0.0, "tokens_loaded_from_storage": 1216}}}}
    text = serve_sglang_report.table(result)
    assert "| all_miss | kvstore | 120 | 300 | 410 | 3.20 | 6400 | 0% | 0% | 0% | 0 |" in text
    assert "- **working_set** did not run: `RuntimeError: boom`" in text
    assert "- **mooncake** did not run: not installed" in text
    assert "kvstore (loaded from its store) vs hicache (plain prefill): tokens equal" in text


@pytest.mark.skipif(not RESULT.exists(), reason="no committed bench/results/serve-sglang-latest.json")
def test_the_docs_table_is_the_committed_result():
    """docs/benchmarks/serve-sglang.md quotes `python -m bench.serve_sglang_report` of the committed JSON, verbatim."""
    result = json.loads(RESULT.read_text())
    assert not result.get("quick") and result["outputs_agree"] is True
    doc = DOC.read_text()
    block = re.search(r"<!-- serve-sglang table -->\n(.*?)<!-- end -->", doc, re.S)
    assert block, "docs/benchmarks/serve-sglang.md lost its table markers"
    assert block.group(1) == serve_sglang_report.table(result)
    assert result["date"][:8] in doc.replace("-", "")      # the run the page describes


def test_quick_runs_write_elsewhere():
    source = (REPO / "bench" / "serve_sglang.py").read_text()
    assert 'write_result("serve-sglang", result, quick=args.quick, out=args.out)' in source
    assert os.path.basename(RESULT) == "serve-sglang-latest.json"


def test_the_page_first_direct_stand_ins_move_each_token_row_to_its_page_slot_and_back():
    """The CPU stand-ins for SGLang's `page_first_direct` direct I/O (its Mooncake backend's host layout): device
    rows written to host slots land at [page, layer, offset] of each plane, and come back to other device rows."""
    torch = pytest.importorskip("torch")
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_site", REPO / "bench" / "sglang_site" / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)   # without SGLANG_USE_CPU_ENGINE it installs nothing
    layers, page, pages, heads, dim = 3, 4, 5, 2, 8
    device = [torch.randn(32, heads, dim) for _ in range(2 * layers)]           # K's layers, then V's
    host = [torch.zeros(pages, layers, page, heads, dim) for _ in range(2)]
    src, dst = torch.tensor([3, 9, 10, 11]), torch.tensor([8, 9, 10, 11])      # device rows -> host page 2
    site.transfer_kv_all_layer_direct_lf_pf(device, host, src, dst, page)
    for plane in range(2):
        for layer in range(layers):
            assert torch.equal(host[plane][2, layer], device[plane * layers + layer][src])
    assert host[0][[0, 1, 3, 4]].abs().sum() == 0
    back = [torch.zeros(32, heads, dim) for _ in range(2)]
    site.transfer_kv_per_layer_direct_pf_lf(host, back, dst, torch.tensor([0, 1, 2, 3]), 1, page)
    assert torch.equal(back[0][:4], device[1][src]) and torch.equal(back[1][:4], device[layers + 1][src])
