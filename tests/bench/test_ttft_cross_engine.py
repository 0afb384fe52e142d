"""The cross-engine TTFT bench's committed result: both engines load what each saved, with the ratio it reports."""

from __future__ import annotations

import json

from bench import _common, ttft_cross_engine


def test_the_committed_result_has_each_loading_engine_and_its_ratio():
    with open(_common.latest_path("ttft-cross-engine")) as f:
        result = json.load(f)
    assert result["goal"] == ttft_cross_engine.GOAL and result["chunk_tokens"] == ttft_cross_engine.CHUNK
    for loader in ("vllm", "sglang"):
        r = result[loader]
        assert len(r["same_samples"]) == len(r["cross_samples"]) == result["repeats"]
        assert r["cross_over_same"] == r["cross_s"] / r["same_s"]
