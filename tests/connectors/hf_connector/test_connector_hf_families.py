"""transformers connector per model family, real daemon: sliding-window (Gemma 3, Mistral) and MLA (DeepSeek).

The strongest check: logits of the rest of the prompt and the greedy tokens after it are the same with a
loaded prefix as with a full prefill.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("transformers")

from harness.engines.tiny import greedy, prefill, prompt, tiny_deepseek, tiny_gemma3, tiny_llama, tiny_mistral

from kvstore.connectors.common.families import Family
from kvstore.connectors.hf import (
    load_prefix, model_layout, model_namespace, new_cache, save_prefix,
)

CHUNK = 128


@pytest.fixture
def kv(daemon):
    c = daemon.client(chunk_tokens=CHUNK)
    yield c
    c.close()


def assert_continues_like_full_prefill(model, ids: torch.Tensor, cache, n: int, steps: int = 8) -> None:
    full_logits, full_cache = prefill(model, ids, new_cache(model))
    logits, cache = prefill(model, ids, cache, start=n)
    torch.testing.assert_close(logits, full_logits[:, n:], atol=1e-4, rtol=1e-4)
    assert greedy(model, logits, cache, steps) == greedy(model, full_logits, full_cache, steps)


FAMILIES = {
    "gemma3": lambda **kw: tiny_gemma3(**kw),
    "mistral": lambda **kw: tiny_mistral(**kw),
    "deepseek_v2": lambda **kw: tiny_deepseek(version=2, **kw),
    "deepseek_v3": lambda **kw: tiny_deepseek(version=3, **kw),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_second_prompt_loads_shared_prefix_and_continues_like_full_prefill(kv, family):
    model = FAMILIES[family]()
    prefix = prompt(3 * CHUNK, seed=1)
    first = torch.cat([prefix, prompt(37, seed=2)], dim=1)
    second = torch.cat([prefix, prompt(50, seed=3)], dim=1)

    cache, n = load_prefix(kv, model, first)
    assert n == 0
    _, cache = prefill(model, first, cache)  # the cache load_prefix returned keeps every layer's every token
    assert save_prefix(kv, model, first, cache) == 3

    cache, n = load_prefix(kv, model, second)
    assert n == 3 * CHUNK
    assert_continues_like_full_prefill(model, second, cache, n)


def test_layouts_name_family_planes_and_attention_kinds():
    gemma = model_layout(tiny_gemma3(), CHUNK)
    assert gemma.family is Family.DENSE and gemma.attention == ("swa64", "full")
    assert gemma.geometry.chunk_shape == (4, 2, CHUNK, 2, 16)
    assert model_layout(tiny_mistral(), CHUNK).attention == ("swa96",)
    mla = model_layout(tiny_deepseek(version=2), CHUNK)
    assert mla.family is Family.MLA and mla.geometry.chunk_shape == (3, 1, CHUNK, 1, 32 + 16)
    ns = model_namespace(tiny_deepseek(version=2), CHUNK)
    assert "family=mla" in ns and "mla=32+16" in ns and "tp=replicated" in ns
    assert "attention=swa64,full" in model_namespace(tiny_gemma3(), CHUNK)
    assert "attention=" not in model_namespace(tiny_llama(), CHUNK)  # a dense model keeps its former namespace


def test_cache_that_dropped_the_window_saves_nothing_and_warns(kv, caplog):
    from transformers import DynamicCache

    model = tiny_gemma3()
    ids = prompt(2 * CHUNK + 10, seed=4)
    _, sliding = prefill(model, ids, DynamicCache(config=model.config))  # sliding layers keep 63 tokens
    with caplog.at_level(logging.WARNING, logger="kvstore.connectors.hf"):
        assert save_prefix(kv, model, ids, sliding) == 0
    assert "new_cache" in caplog.text
    assert load_prefix(kv, model, ids)[1] == 0


def test_multi_turn_with_sliding_layers(kv):
    model = tiny_mistral()
    history = prompt(200, seed=5)
    loaded = []
    for turn in range(3):
        cache, n = load_prefix(kv, model, history)
        loaded.append(n)
        if n:
            assert_continues_like_full_prefill(model, history, load_prefix(kv, model, history)[0], n, steps=4)
        logits, cache = prefill(model, history, cache, start=n)
        reply = greedy(model, logits, cache, 10)
        conversation = torch.cat([history, torch.tensor([reply])], dim=1)
        save_prefix(kv, model, conversation, cache)
        history = torch.cat([conversation, prompt(120, seed=20 + turn)], dim=1)
    # turn 1: 200 + 10 + 120 = 330 tokens, 209 held -> 128; turn 2: 460 tokens, 339 held -> 256
    assert loaded == [0, 128, 256]


def test_other_family_window_or_dtype_never_hits(kv):
    ids = prompt(2 * CHUNK + 5, seed=6)
    gemma = tiny_gemma3()
    _, cache = prefill(gemma, ids, new_cache(gemma))
    assert save_prefix(kv, gemma, ids, cache) == 2
    assert load_prefix(kv, gemma, ids)[1] == 2 * CHUNK
    assert load_prefix(kv, tiny_gemma3(window=32), ids)[1] == 0  # same weights, another window
    assert load_prefix(kv, tiny_gemma3(dtype=torch.bfloat16), ids)[1] == 0
    ds = tiny_deepseek(version=2)
    _, cache = prefill(ds, ids, new_cache(ds))
    assert save_prefix(kv, ds, ids, cache) == 2
    assert load_prefix(kv, tiny_deepseek(version=2, seed=1), ids)[1] == 0
    assert load_prefix(kv, tiny_deepseek(version=2, kv_lora_rank=48), ids)[1] == 0


def test_unknown_layer_types_and_encoder_decoder_are_refused_once_with_a_reason(kv, caplog):
    from transformers import T5Config, T5ForConditionalGeneration

    model = tiny_llama()
    model.config.layer_types = ["full_attention", "indexed_attention", "full_attention", "full_attention"]
    ids = prompt(CHUNK + 3, seed=7)
    with caplog.at_level(logging.WARNING, logger="kvstore.connectors.hf"):
        assert load_prefix(kv, model, ids)[1] == 0
        assert save_prefix(kv, model, ids, prefill(model, ids)[1]) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["kvstore transformers connector off (llama): layers of type 'indexed_attention' "
                     "have no chunk layout"]
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=32, d_ff=64, num_layers=1, num_heads=2,
                                             d_kv=16)).eval()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvstore.connectors.hf"):
        assert load_prefix(kv, t5, ids % 64)[1] == 0
    assert "off (t5): encoder-decoder" in caplog.text


@pytest.mark.parametrize("family", ["gemma3", "deepseek_v3"])
def test_verify_compares_the_computed_latent_or_windowed_kv_with_the_stored_chunks(kv, family):
    model = FAMILIES[family]()
    ids = prompt(2 * CHUNK + 9, seed=8)
    _, cache = prefill(model, ids, new_cache(model))
    assert save_prefix(kv, model, ids, cache) == 2
    before = kv.stats()["verify"]
    cache, n = load_prefix(kv, model, ids, verify_fraction=1.0)   # computed, compared, not loaded
    assert n == 2 * CHUNK
    assert_continues_like_full_prefill(model, ids, cache, n, steps=4)
    after = kv.stats()["verify"]
    assert (after["checks"] - before["checks"], after["mismatches"] - before["mismatches"]) == (2, 0)
