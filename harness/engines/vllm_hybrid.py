"""Hybrid models in real vLLM engines: the settings and checks the hybrid engine tests and benchmark share.

Any `kv_transfer_config` makes vLLM's CPU worker reserve a core and change its thread count, which changes
outputs: every engine that is compared with another is pinned to one reserved core (`PINNED`).
"""

from __future__ import annotations

from typing import Any

from .vllm_real import CHUNK, LOGPROB_TOL, EngineProc, delta

PINNED = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}

# Families whose prefill one block a step (as the hybrid engine must run) is not plain prefill's on this build,
# with or without the connector: their loads are held to what the saving engine computed, not to plain prefill.
# LFM2: a plain engine prefilling one 128-token block a step (no connector, no prefix caching) gives another first
# token than one prefilling the prompt in one step, and exactly what the saving engine gives
# (docs/connectors/model-families.md).
ENGINE_REFERENCE = frozenset({"hybrid-lfm2"})


def loads(engine_proc: EngineProc, batch: list[list[int]], max_tokens: int = 8
          ) -> tuple[list[dict[str, Any]], int, int]:
    """Generate `batch` after vLLM forgot its own cache; returns (outputs, chunks loaded, load failures)."""
    engine_proc.reset_prefix_cache()
    before = engine_proc.stats()
    out = engine_proc.generate(batch, max_tokens)
    after = engine_proc.stats()
    return out, delta(after, before, "worker", "chunks_loaded"), delta(after, before, "worker", "load_failures")


def zero_states(daemon: Any, engine_proc: EngineProc, batch: list[list[int]], chunk: int = CHUNK) -> None:
    """Rewrite the stored chunks of `batch` (of `chunk` tokens) with every recurrent state zeroed (attention KV
    kept as it was)."""
    parts = engine_proc.chunk_parts()
    assert [p["kind"] for p in parts].count("state") >= 1
    with engine_proc.chunk_client(daemon) as c:
        for prompt, keys in zip(batch, engine_proc.chunk_keys(batch)):
            keys = keys[: (len(prompt) - 1) // chunk]
            with c.get(keys) as views:
                chunks = [bytearray(bytes(v)) for v in views]
            assert len(chunks) == len(keys)
            for data in chunks:
                at = 0
                for part in parts:
                    if part["kind"] == "state":
                        data[at:at + part["nbytes"]] = bytes(part["nbytes"])
                    at += part["nbytes"]
                assert at == len(data)
            assert c.delete(keys) == len(keys)
            assert c.put(keys, chunks) == len(keys)


def differs(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> bool:
    """Whether outputs differ from `want` beyond what `assert_same` allows."""
    worst = max(abs(g["logprobs"][0] - w["logprobs"][0]) for g, w in zip(got, want))
    return worst > LOGPROB_TOL or any(g["tokens"] != w["tokens"] for g, w in zip(got, want))
