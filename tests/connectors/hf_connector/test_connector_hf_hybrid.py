"""transformers connector for hybrid models (attention plus Mamba-2, short-conv or Gated DeltaNet layers), real daemon.

A hybrid chunk holds its tokens' attention KV and every recurrent layer's state after its last token. A
prefix loaded from the store, with the rest of the prompt prefilled on it, must give what a plain prefill of
the whole prompt gives: the same greedy tokens and the first token's log-probability within 1e-3.

Chunk-by-chunk prefill (how `save_prefix` computes a hybrid prefix) against one pass, float32 on the CPU,
measured for these tiny models (largest logit difference): Granite 4 (GraniteMoeHybrid) 8e-6, LFM2 4e-6,
Falcon-H1 1.1e-5, Nemotron-H 4e-6, Zamba2 5e-5, Qwen3-Next 3e-5, Bamba 5e-6 (given positions: without
`position_ids` transformers 5.25's Bamba numbers each call's tokens from 0, and a continued prefill differs
from one pass by over 4, with or without kvstore; the connector's own passes give them). The chunked scans
and the convs continue from the cached state exactly; only the summation order differs. So every family is
held to plain prefill here.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("transformers")

from harness.engines.tiny import (
    cache_kwarg, prompt, tiny_bamba, tiny_falcon_h1, tiny_granite_hybrid, tiny_lfm2, tiny_llama, tiny_nemotron_h,
    tiny_qwen3_next, tiny_zamba2,
)

import kvstore
from kvstore.connectors.hf import load_prefix, model_layout, model_namespace, new_cache, save_prefix

CHUNK = 64
STEPS = 8

FAMILIES = {
    "granitemoehybrid": tiny_granite_hybrid,
    "lfm2": tiny_lfm2,
    "falcon_h1": tiny_falcon_h1,
    "nemotron_h": tiny_nemotron_h,
    "zamba2": tiny_zamba2,
    "qwen3_next": tiny_qwen3_next,
    "bamba": tiny_bamba,
}


@pytest.fixture
def kv(daemon):
    c = daemon.client(chunk_tokens=CHUNK)
    yield c
    c.close()


def first_logprob(logits: torch.Tensor) -> tuple[int, float]:
    """The greedy next token after the prompt and its log-probability."""
    logp = torch.log_softmax(logits[0, -1].float(), dim=-1)
    token = int(logp.argmax())
    return token, float(logp[token])


@torch.no_grad()
def forward(model, ids: torch.Tensor, cache, start: int) -> torch.Tensor:
    """Logits of `ids` (at positions `start`...) on `cache`. Positions are given: transformers 5.25's Bamba
    numbers every call's tokens from 0 otherwise."""
    positions = torch.arange(start, start + ids.shape[1])[None]
    return model(ids, position_ids=positions, use_cache=True, **{cache_kwarg(model): cache}).logits


def continue_from(model, ids: torch.Tensor, cache, n: int) -> tuple[torch.Tensor, list[int]]:
    """Prefill `ids[n:]` on `cache` (which holds `ids[:n]`); the last logits and the greedy tokens after."""
    logits = forward(model, ids[:, n:], cache, n)
    tokens, last = [], logits
    for step in range(STEPS):
        tokens.append(int(last[0, -1].argmax()))
        last = forward(model, torch.tensor([[tokens[-1]]]), cache, ids.shape[1] + step)
    return logits, tokens


def plain(model, ids: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    return continue_from(model, ids, new_cache(model), 0)


def assert_same(got: tuple[torch.Tensor, list[int]], want: tuple[torch.Tensor, list[int]]) -> float:
    """Same greedy tokens and first-token log-probability within 1e-3; returns that difference."""
    (got_token, got_lp), (want_token, want_lp) = first_logprob(got[0]), first_logprob(want[0])
    assert got_token == want_token and got[1] == want[1]
    assert abs(got_lp - want_lp) < 1e-3, (got_lp, want_lp)
    return abs(got_lp - want_lp)


def zero_states(cache) -> None:
    for layer in cache.layers:
        for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {})):
            for tensor in states.values():
                if tensor is not None:
                    tensor.zero_()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_loaded_prefix_continues_like_plain_prefill_and_needs_its_state(kv, family):
    model = FAMILIES[family]()
    ids = prompt(3 * CHUNK + 20, seed=1)
    want = plain(model, ids)

    cache, n = load_prefix(kv, model, ids)
    assert n == 0
    assert save_prefix(kv, model, ids, None) == 3
    assert save_prefix(kv, model, ids, None) == 0   # nothing new

    fresh = FAMILIES[family]()   # another instance of the same weights: the same namespace
    assert model_namespace(fresh, CHUNK) == model_namespace(model, CHUNK)
    cache, n = load_prefix(kv, fresh, ids)
    assert n == 3 * CHUNK and int(cache.get_seq_length()) == n
    diff = assert_same(continue_from(fresh, ids, cache, n), want)
    print(f"{family}: first-token log-probability differs by {diff:.2e}")

    cache, n = load_prefix(kv, fresh, ids)   # the same load with the recurrent states zeroed: other outputs
    zero_states(cache)
    logits, _ = continue_from(fresh, ids, cache, n)
    moved = float((torch.log_softmax(logits[0, -1], -1) - torch.log_softmax(want[0][0, -1], -1)).abs().max())
    print(f"{family}: zeroed states move the last log-probabilities by up to {moved:.2e}")
    assert moved > 1e-2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_prefix_without_its_last_chunk_loads_one_chunk_fewer(kv, family):
    model = FAMILIES[family]()
    ids = prompt(3 * CHUNK + 20, seed=3)
    want = plain(model, ids)
    assert save_prefix(kv, model, ids, None) == 3
    keys = kvstore.chunk_keys(model_namespace(model, CHUNK), ids[0].tolist(), CHUNK)
    assert kv.delete(keys[2:3]) == 1

    cache, n = load_prefix(kv, model, ids)
    assert n == 2 * CHUNK   # chunk 1's state with chunks 0-1's KV: the state and KV never part
    assert_same(continue_from(model, ids, cache, n), want)
    assert save_prefix(kv, model, ids, None) == 1   # computed again from the stored two
    assert load_prefix(kv, model, ids)[1] == 3 * CHUNK


def test_state_layout_is_in_the_namespace():
    granite = tiny_granite_hybrid()
    layout = model_layout(granite, CHUNK)
    assert layout.state.startswith("hf1:2attn:4parts:") and layout.geometry.num_layers == 2
    assert f"state={layout.state}" in model_namespace(granite, CHUNK)
    other = tiny_granite_hybrid(layer_types=("full_attention", "linear_attention") * 2)
    assert model_layout(other, CHUNK).state != layout.state
    half = tiny_granite_hybrid(dtype=torch.bfloat16)
    assert model_layout(half, CHUNK).state != layout.state


def test_a_model_whose_layers_do_not_fill_a_hybrid_cache_is_refused_once(kv, caplog):
    model = tiny_llama()   # its config claims a recurrent layer its modules do not have
    model.config.layer_types = ["full_attention", "linear_attention", "full_attention", "full_attention"]
    ids = prompt(CHUNK + 3, seed=7)
    with caplog.at_level(logging.WARNING, logger="kvstore.connectors.hf"):
        assert load_prefix(kv, model, ids)[1] == 0
        assert save_prefix(kv, model, ids, None) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith(
        "kvstore transformers connector off (llama): its recurrent layers do not run on a cache laid out")
