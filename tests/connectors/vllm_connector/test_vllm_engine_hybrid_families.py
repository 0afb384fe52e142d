"""Every hybrid family vLLM's CPU build runs, in a real engine with a real daemon: tiny random-weight models
(hidden size 64, four layers, float32, `initializer_range` 0.2 so that the recurrent state moves the outputs).

Per family, one engine saves and another process loads; both must give plain prefill's outputs (an engine with
no connector and no prefix caching): the same greedy tokens, first-token log-probabilities within 1e-3 (LFM2,
whose block-by-block prefill is not plain prefill on this build even without the connector: what the saving
engine computed, `ENGINE_REFERENCE`). Then the
last stored chunk of one prompt is gone, as after an eviction (its attention KV and its state are one object,
so they go together): that prompt is a shorter hit, one chunk fewer, with the same outputs. Last, the stored
chunks with their recurrent states zeroed still load but no longer give those outputs, so the equality is the
state's doing. All along, the daemon's KV cache events (decoded by vLLM's classes) announce each chunk once per
KV cache group, attention and state, as vLLM announces its own hybrid blocks, and the evicted chunk leaves both
groups at once: a router never counts a block whose state is gone. The Granite 4 shape (Mamba-2, the first
hybrid family served) and Gated DeltaNet are ``test_vllm_engine_hybrid.py``'s; what this build cannot run is
listed in docs/connectors/model-families.md.

Engine settings as there: prefix caching on (vLLM keeps states only in its align mode), one block and one
prefill a step (the CPU Mamba-2 scan returns only final states), one reserved core pinned. The hybrid block is
the family's (vLLM sizes it so that an attention page holds a state page): 256 tokens on the Falcon-H1 and
Nemotron-H shapes here, 128 on the Zamba2 and LFM2 ones; the connector's `chunk_tokens` equals it.
"""

from __future__ import annotations

import os

import pytest

from conftest import wait_for
from harness.engines.vllm_hybrid import ENGINE_REFERENCE, PINNED, differs, loads, zero_states
from harness.engines.vllm_real import (
    assert_same, prompts, stored,
)
from support.engines.vllm_fixtures import engine_venv, pool  # noqa: F401 - fixtures
from support.events_consumer import Consumer

pytestmark = pytest.mark.timeout(900)   # up to three engine starts per family, on a shared machine

SIZE = (64, 4)   # hidden size, layers
TOKENS = 4       # generated per prompt
FAMILIES = {     # family -> its hybrid block on this shape (vLLM's block of every group in align mode)
    "hybrid-falcon-h1": 256,      # attention and Mamba-2 side by side in every layer
    "hybrid-nemotron-h": 256,     # Mamba-2, attention and MLP blocks, one a layer
    "hybrid-zamba2": 128,         # Mamba-2 layers and one shared attention block
    "hybrid-lfm2": 128,           # gated short convolutions and attention layers in turn
}


# Three engine starts a family (two for LFM2), minutes on a shared 2-core machine: a run covers LFM2 (a
# short-convolution state, a 128-token block: the shape least like the Granite 4 one test_vllm_engine_hybrid.py
# holds to plain prefill in every run) unless KVSTORE_TEST_HYBRID_FAMILIES=all asks for every family
# (docs/development/testing.md).
EVERY_RUN = ("hybrid-lfm2",)
ALL_FAMILIES = os.environ.get("KVSTORE_TEST_HYBRID_FAMILIES") == "all"


def family_params() -> list:
    return [pytest.param(f, marks=() if ALL_FAMILIES or f in EVERY_RUN else pytest.mark.skip(
        reason=f"{f}: KVSTORE_TEST_HYBRID_FAMILIES=all runs it (three engine starts a family)")) for f in FAMILIES]


def chunks_of(batch: list[list[int]], block: int) -> list[int]:
    """The chunks the connector stores of each prompt (never the one holding its last token)."""
    return [(len(p) - 1) // block for p in batch]


@pytest.fixture
def events(pool):
    """A consumer of the daemon-wide event stream, on endpoints in the pool's directory."""
    consumer = Consumer(*("ipc://" + os.path.join(pool.workdir, n) for n in ("ev.sock", "evr.sock")), topic="",
                        exact=True)
    yield consumer
    consumer.close()


@pytest.mark.parametrize("family", family_params())
def test_a_family_loads_attention_kv_and_state_and_an_evicted_last_chunk_is_a_shorter_hit(pool, start_daemon,
                                                                                        events, family):
    block = FAMILIES[family]
    daemon = start_daemon("--disk-size", "0", "--host-mem", "128MiB", "--events-endpoint", events.endpoint,
                          "--events-replay-endpoint", events.replay_endpoint, workdir=pool.workdir)
    batch = prompts(2, 2 * block + 40, seed=101)                # two chunks each, and a few tokens
    total = sum(chunks_of(batch, block))
    common = {"family": family, "size": SIZE, "num_blocks": 32, "env": PINNED, "max_model_len": 2048}
    connected = {**common, "connector": pool.connector(chunk_tokens=block), "max_num_batched_tokens": block,
                 "max_num_seqs": 1}
    pool.keep()
    want = None if family in ENGINE_REFERENCE else (
        pool.get(f"{family}-plain", prefix_caching=False, **common).generate(batch, TOKENS))
    pool.keep()
    saver = pool.get(f"{family}-a", **connected)
    assert [p["kind"] for p in saver.chunk_parts()].count("state") >= 1
    computed = saver.generate(batch, TOKENS)
    if want is None:
        want = computed
    assert_same(computed, want)
    assert wait_for(lambda: stored(daemon) == total)
    usable = published(daemon, events)                            # each chunk in both groups, as vLLM's own
    assert set(events.group_kinds.values()) == {"full_attention", "mamba"}
    assert len(usable) == total and {size for _, size in usable.values()} == {block}
    pool.keep()
    loader = pool.get(f"{family}-b", **connected)                 # another engine process
    out, loaded, failed = loads(loader, batch, TOKENS)
    assert_same(out, want)
    assert (loaded, failed) == (total, 0)

    keys = loader.chunk_keys(batch[:1])[0][: chunks_of(batch, block)[0]]
    with loader.chunk_client(daemon) as c:                        # the first prompt's last chunk evicted
        assert c.delete(keys[-1:]) == 1
    left = published(daemon, events)                              # gone from every group at once
    assert len(left) == total - 1 and set(left) < set(usable) and not set(events.by_group) - set(left)
    out, loaded, failed = loads(loader, batch, TOKENS)
    assert_same(out, want)                                        # a shorter hit, never a wrong one
    assert (loaded, failed) == (total - 1, 0)

    zero_states(daemon, loader, batch[1:], block)                 # without the state: other outputs
    out, loaded, failed = loads(loader, batch[1:], TOKENS)
    assert (loaded, failed) == (chunks_of(batch, block)[1], 0)
    assert differs(out, want[1:])
    pool.keep()


def published(daemon, events) -> dict[int, tuple[int, int]]:
    """What the events say a load can use now: per engine block hash held in DRAM by every group, its parent and
    block size."""
    with daemon.client(namespace="watch") as c:
        s = c.stats()["events"]
    events.pump(s["next_seq"] - 1, s["incarnation"])
    return {h: (events.blocks[h][0], events.blocks[h][2]) for h, media in events.held.items() if "CPU" in media}
