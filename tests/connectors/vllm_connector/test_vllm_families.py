"""Model families in real vLLM engines (the CPU build, in its own virtualenv) with a real daemon.

Per family the CPU build runs (dense is `test_vllm_engine.py`'s): an engine saves a batch, forgets its own cache
and loads it (that another process loads what one saved is the dense tests' and the cross-engine tests'), and
its greedy tokens and log-probabilities equal a plain engine's (no connector, no prefix caching: every prompt
prefilled in full); a model of another family sent the same prompts loads nothing.

* Sliding window (Gemma-3-shaped: three sliding layers of window 64, one full layer). The CPU build runs
  vLLM's hybrid allocator here: four KV cache groups, each its own block table, the sliding groups holding
  only the blocks inside their window; loads write exactly those blocks.
* MLA (DeepSeek-V2-shaped: one 576-wide latent-plus-rope row per token per layer). vLLM turns its own prefix
  caching and chunked prefill off for MLA on the CPU, but its CPU MLA backend computes the tokens after a
  loaded prefix as a prefill over the cached latents (gathered, up-projected and merged with the new tokens'
  attention by log-sum-exp), the same arithmetic as a full prefill: prompts of 1,400 tokens (five chunks
  loaded, 120 tokens computed) give plain prefill's first-token log-probabilities to float32 rounding across
  batch shapes (`LOGPROB_TOL`). A prompt of whole chunks plus one token computes that token as a decode step
  (the absorbed kernel), and every later token is one, over latents the loading engine computed in batches
  of other shapes: those log-probabilities are held to `MLA_TOL`, with equal tokens. That the stored latents
  are the bytes vLLM computes is checked exactly: an engine that computes its hits compares them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from conftest import wait_for
from harness.engines.vllm_real import (
    CHUNK, LOGPROB_TOL, assert_same, delta, full_chunks, prompts, stored,
)
from support.engines.vllm_fixtures import engine_venv, pool  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(900)   # engine starts of minutes each on a small, shared CPU machine

MLA_TOL = 1e-2
NUM_BLOCKS = {"sliding": 256, "mla": 2048}   # 32k tokens of KV each (MLA blocks hold 16 tokens)


@pytest.fixture
def kv_daemon(start_daemon, pool):
    disk = tempfile.mkdtemp(prefix="disk-", dir=pool.workdir)
    return start_daemon("--disk-dir", disk, "--host-mem", "256MiB", workdir=pool.workdir)


def engine(pool, family: str, name: str, connector: bool = True, **extra):
    config = {"family": family, "num_blocks": NUM_BLOCKS[family]}
    if connector:
        config["connector"] = pool.connector(**extra)
    else:
        config["prefix_caching"] = False
    return pool.get(f"{family}-{name}", **config)


def loads(engine_proc, batch, max_tokens: int = 8):
    """Generate `batch`; returns (outputs, chunks loaded, load failures)."""
    before = engine_proc.stats()
    out = engine_proc.generate(batch, max_tokens)
    after = engine_proc.stats()
    return out, delta(after, before, "worker", "chunks_loaded"), delta(after, before, "worker", "load_failures")


def close(got, want, tol: float, first_tol: float | None = None) -> None:
    """The same greedy tokens; log-probabilities within `tol`, the first token's within `first_tol`."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g["tokens"] == w["tokens"], f"prompt {i}: tokens differ"
        first = abs(g["logprobs"][0] - w["logprobs"][0])
        assert first <= (tol if first_tol is None else first_tol), f"prompt {i}: first token's differs by {first}"
        worst = max(abs(a - b) for a, b in zip(g["logprobs"], w["logprobs"]))
        assert worst <= tol, f"prompt {i}: log-probabilities differ by {worst}"


def test_sliding_window_engine_loads_what_it_saved(pool, kv_daemon):
    batch = prompts(3, 1100, seed=81)
    want = engine(pool, "sliding", "plain", connector=False).generate(batch)
    pool.keep("sliding-plain", "sliding-a", "a")
    a = engine(pool, "sliding", "a")
    assert_same(a.generate(batch), want)
    assert wait_for(lambda: stored(kv_daemon) == full_chunks(batch))
    a.reset_prefix_cache()
    out, loaded, failed = loads(a, batch)
    assert_same(out, want)
    assert (loaded, failed) == (full_chunks(batch), 0)
    # A longer prompt over the stored prefix: the sliding groups get only their window's blocks of it.
    longer = [batch[0] + prompts(1, 600, seed=82)[0]]
    want_longer = engine(pool, "sliding", "plain", connector=False).generate(longer)
    a.reset_prefix_cache()
    out, loaded, failed = loads(a, longer)
    assert_same(out, want_longer)
    assert (loaded, failed) == (1100 // CHUNK, 0)
    # vLLM kept its hybrid allocator on (the connector supports it): several groups, each its own blocks.
    assert "Turning off hybrid" not in Path(a.log_path).read_text(errors="replace")
    # Another family, the same prompts: its own namespace, nothing loaded.
    pool.keep("sliding-a", "a")
    _, loaded, _ = loads(pool.get("a", connector=pool.connector()), batch)
    assert loaded == 0


def test_mla_engine_loads_the_latents_it_saved(pool, kv_daemon):
    # 1,400 tokens: five chunks loaded, 120 tokens prefilled over them; one of whole chunks plus one token.
    batch = prompts(2, 1400, seed=91) + prompts(1, 4 * CHUNK + 1, seed=92)
    want = engine(pool, "mla", "plain", connector=False).generate(batch, 4)
    pool.keep("mla-plain", "mla-a", "a")
    a = engine(pool, "mla", "a")
    close(a.generate(batch, 4), want, 1e-5)  # a miss: a full prefill, saved
    assert wait_for(lambda: stored(kv_daemon) == full_chunks(batch))
    with kv_daemon.client() as c:  # one latent plane: layers x tokens x 576 float32
        assert c.stats()["tiers"]["host"]["used_bytes"] >= full_chunks(batch) * 3 * CHUNK * 576 * 4
    # vLLM keeps no prefix cache of its own for MLA on the CPU: the same prompts again are loaded
    out, loaded, failed = loads(a, batch, 4)
    assert (loaded, failed) == (full_chunks(batch), 0)
    close(out[:2], want[:2], MLA_TOL, first_tol=LOGPROB_TOL)   # computed as a prefill over the loaded latents
    close(out[2:], want[2:], MLA_TOL)                          # the last token computed as a decode step
    # What was stored is what an engine computes: an engine that computes its hits compares them, exactly.
    pool.keep("mla-plain", "a")
    checker = engine(pool, "mla", "verify", verify_fraction=1.0)
    before = checker.stats()
    close(checker.generate(batch, 4), want, 1e-5)
    assert wait_for(lambda: delta(checker.stats(), before, "worker", "chunks_verified") == full_chunks(batch))
    assert delta(checker.stats(), before, "worker", "verify_mismatches") == 0
    # A model of another family sent the same prompts loads none of these chunks.
    pool.keep("mla-verify", "a")
    _, loaded, _ = loads(pool.get("a", connector=pool.connector()), batch, 1)
    assert loaded == 0
