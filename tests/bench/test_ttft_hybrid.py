"""The hybrid TTFT bench covers every hybrid family the engine script makes, holds each to the right reference,
and its committed result has one entry per family under ``families``."""

from __future__ import annotations

import json
import re

import pytest

from bench import _common, ttft_hybrid
from harness.engines.vllm_real import ENGINE_SCRIPT


def test_every_hybrid_family_the_engine_script_saves_is_measured():
    saved = re.findall(r'family == "(hybrid-[a-z0-9-]+)"', ENGINE_SCRIPT.read_text())
    assert saved and sorted(saved) == sorted(ttft_hybrid.FAMILIES)


def test_a_family_is_held_to_plain_prefill_unless_this_build_makes_that_no_reference():
    held = {f: ttft_hybrid.reference(f) for f in ttft_hybrid.FAMILIES}
    assert {f for f, (against, _) in held.items() if against == "miss"} == {"hybrid-lfm2", "hybrid-gdn"}
    assert all(why for against, why in held.values() if against == "miss")
    assert ttft_hybrid.DTYPE == {"hybrid-gdn": "bfloat16"}


def test_families_are_read_with_the_common_reader():
    assert _common.parse_names("hybrid-lfm2, hybrid-gdn", "--families", ttft_hybrid.FAMILIES) == [
        "hybrid-lfm2", "hybrid-gdn"]
    with pytest.raises(SystemExit, match="--families: unknown"):
        _common.parse_names("hybrid-mamba1", "--families", ttft_hybrid.FAMILIES)


def test_the_committed_result_has_every_family_with_its_ratios():
    result = json.load(open(_common.latest_path("ttft-hybrid")))
    families = result["families"]
    assert set(families) == set(ttft_hybrid.FAMILIES)
    for family, r in families.items():
        assert "error" not in r, f"{family}: {r.get('error')}"
        assert r["prompt_tokens"] == r["chunks"] * r["block_tokens"] + 1
        assert r["hit_over_plain"] == pytest.approx(r["hit_s"] / r["plain_s"])
        assert r["hit_over_miss"] == pytest.approx(r["hit_s"] / r["miss_s"])
        assert r["state_share"] == pytest.approx(r["state_bytes_per_chunk"] / r["chunk_bytes"])
        assert sum(p["nbytes"] for p in r["chunk_parts"]) == r["chunk_bytes"]
        assert len(r["hit_samples"]) == result["repeats"]
