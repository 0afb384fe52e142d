"""Hybrid models in a real vLLM engine (the CPU build, in its own virtualenv) with a real daemon: a Granite 4
(GraniteMoeHybrid) shaped model, Mamba-2 and attention layers in turn, float32, random weights drawn wide
(`initializer_range` 0.2) so that the recurrent state moves the outputs.

A chunk holds its attention KV and the state at its last token (``kvstore.connectors.vllm.hybrid``). vLLM keeps
states for prefix caching in its align mode only, whose block is 256 tokens (the connector's `chunk_tokens`).
Its CPU scan needs one block and one prefill a step (two prefills in one step fail in `mamba_mixer2`, with or
without the connector): `max_num_batched_tokens` 256, `max_num_seqs` 1. Every output is checked against a
plain engine (no connector, no prefix caching: every prompt prefilled in full). Any `kv_transfer_config` makes
the CPU worker reserve a core and change its thread count, so every engine here is pinned to one reserved core.
Gated DeltaNet (Qwen3-Next shaped) runs on the CPU build in bfloat16 only: its loads are checked against what
the same engine computed.
"""

from __future__ import annotations

import pytest

from conftest import wait_for
from harness.engines.vllm_hybrid import PINNED, differs, loads, zero_states
from harness.engines.vllm_real import (
    CHUNK, assert_same, full_chunks, prompts, stored,
)
from support.engines.vllm_fixtures import engine_venv, pool  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(1200)   # three engine starts in one test, on a shared machine

FAMILY = "hybrid-mamba2"


def engine(pool, name: str, connector: bool = True, **extra):
    """A hybrid engine: with the connector (prefix caching in align mode, one block a step) or plain."""
    config = {"family": FAMILY, "num_blocks": 128, "env": PINNED, "max_model_len": 4096}
    if connector:
        config.update(connector=pool.connector(**extra), max_num_batched_tokens=CHUNK, max_num_seqs=1)
    else:
        config["prefix_caching"] = False
    return pool.get(f"hybrid-{name}", **config)


def test_another_engine_and_a_restarted_daemon_load_attention_kv_and_state(pool, start_daemon):
    daemon = start_daemon("--adopt", "--disk-size", "0", "--host-mem", "256MiB", workdir=pool.workdir)
    batch = prompts(3, 1100, seed=91)              # four chunks each, the state of the fourth loaded
    want = engine(pool, "plain", connector=False).generate(batch)
    pool.keep("hybrid-plain", "hybrid-a")
    assert_same(engine(pool, "a").generate(batch), want)
    assert wait_for(lambda: stored(daemon) == full_chunks(batch))
    pool.keep("hybrid-plain", "hybrid-b")
    out, loaded, failed = loads(engine(pool, "b"), batch)                 # a new engine process
    assert_same(out, want)
    assert (loaded, failed) == (full_chunks(batch), 0)
    daemon.restart()
    assert wait_for(lambda: stored(daemon) == full_chunks(batch))         # adopted, verified

    def loads_everything() -> bool:
        out, loaded, failed = loads(engine(pool, "b"), batch)
        assert_same(out, want)   # a prefill while the connector reconnects, a load after: the same tokens
        return (loaded, failed) == (full_chunks(batch), 0)

    assert wait_for(loads_everything, timeout=60, interval=0.5)
    daemon.restart_without_adopting()   # the engine outlives this test and maps the arena


def test_a_load_without_the_state_would_be_caught(pool, start_daemon):
    """The stored chunks rewritten with their recurrent states zeroed: the load still happens, and its outputs
    are no longer plain prefill's (so the equality above is the state's doing, not the attention KV's)."""
    daemon = start_daemon("--disk-size", "0", "--host-mem", "256MiB", workdir=pool.workdir)
    batch = prompts(2, 1100, seed=93)
    want = engine(pool, "plain", connector=False).generate(batch)
    b = engine(pool, "b")
    b.generate(batch)
    assert wait_for(lambda: stored(daemon) == full_chunks(batch))
    zero_states(daemon, b, batch)
    out, loaded, failed = loads(b, batch)
    assert (loaded, failed) == (full_chunks(batch), 0)
    assert differs(out, want)


def test_a_chunk_size_other_than_the_hybrid_block_is_refused_in_one_line(pool, start_daemon):
    start_daemon("--disk-size", "0", workdir=pool.workdir)
    pool.keep("hybrid-plain", "hybrid-b")
    wrong = pool.get("hybrid-wrong", family=FAMILY, num_blocks=128, env=PINNED, max_model_len=4096,
                     connector=pool.connector(chunk_tokens=2 * CHUNK), max_num_batched_tokens=CHUNK, max_num_seqs=1)
    lines = [line for line in wrong.log_tail(400).splitlines() if "connector off" in line]
    pool.keep("hybrid-plain", "hybrid-b")
    assert lines and f"chunk_tokens {2 * CHUNK} must equal the hybrid block size {CHUNK}" in lines[0]


def test_a_load_off_the_step_writes_the_state_where_vllm_copies_it_from(pool, start_daemon):
    """`load_async` true: the load runs while the request waits; vLLM copies the loaded state into the
    running block when it schedules the request (the loads above run in the step: an idle engine)."""
    daemon = start_daemon("--disk-size", "0", "--host-mem", "256MiB", workdir=pool.workdir)
    batch = prompts(2, 1100, seed=95)
    want = engine(pool, "plain", connector=False).generate(batch)
    engine(pool, "b").generate(batch)
    assert wait_for(lambda: stored(daemon) == full_chunks(batch))
    pool.keep("hybrid-plain", "hybrid-async")
    out, loaded, failed = loads(engine(pool, "async", load_async=True), batch)
    assert_same(out, want)
    assert (loaded, failed) == (full_chunks(batch), 0)


def test_gated_deltanet_loads_equal_what_the_engine_computes(pool, start_daemon):
    """Qwen3-Next shaped (Gated DeltaNet and attention layers in turn), bfloat16: vLLM's CPU Gated DeltaNet
    kernels take nothing else. A hit runs the prompt's last step exactly as the miss did (the same tokens on
    the same kernels), over the loaded attention KV and state instead of computed ones: the same outputs."""
    daemon = start_daemon("--disk-size", "0", "--host-mem", "256MiB", workdir=pool.workdir)
    pool.keep()
    gdn = pool.get("hybrid-gdn", family="hybrid-gdn", dtype="bfloat16", num_blocks=128, env=PINNED,
                   max_model_len=4096, connector=pool.connector(), max_num_batched_tokens=CHUNK, max_num_seqs=1)
    assert [p["kind"] for p in gdn.chunk_parts()].count("state") == 1
    batch = prompts(2, 1100, seed=97)
    want = gdn.generate(batch)
    assert wait_for(lambda: stored(daemon) == full_chunks(batch))
    out, loaded, failed = loads(gdn, batch)
    assert_same(out, want)
    assert (loaded, failed) == (full_chunks(batch), 0)
    zero_states(daemon, gdn, batch)   # and without the state the same load no longer gives those outputs
    out, loaded, failed = loads(gdn, batch)
    assert (loaded, failed) == (full_chunks(batch), 0)
    assert differs(out, want)
    pool.keep()


@pytest.fixture(autouse=True)
def _few_engines(pool):
    yield
    pool.keep("hybrid-plain", "hybrid-b")
