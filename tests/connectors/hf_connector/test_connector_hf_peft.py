"""A PEFT model, its base model and its adapters never share chunks (transformers connector, real daemon)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
peft = pytest.importorskip("peft", reason="PEFT (the `peft` package of the test extra) is not installed")

from harness.engines.tiny import prefill, prompt, tiny_llama  # noqa: E402

from kvstore.connectors.hf import load_prefix, model_namespace, save_prefix, weights_changed  # noqa: E402

CHUNK = 256


@pytest.fixture
def kv(daemon):
    c = daemon.client(chunk_tokens=CHUNK)
    yield c
    c.close()


def lora(model, name: str = "default", seed: int = 1):
    """``model`` with a random LoRA adapter on its K and V projections (lora_B non-zero: it changes the KV)."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["k_proj", "v_proj"], init_lora_weights=False)
    if isinstance(model, peft.PeftModel):
        model.add_adapter(name, config)
        return model
    return peft.get_peft_model(model, config, adapter_name=name).eval()


def saved(kv, model, ids) -> int:
    _, cache = prefill(model, ids)
    return save_prefix(kv, model, ids, cache)


def loaded(kv, model, ids) -> int:
    return load_prefix(kv, model, ids)[1]


def test_a_peft_model_and_its_base_model_never_share_chunks(kv):
    ids = prompt(600, seed=1)
    base = tiny_llama(seed=0)
    tuned = lora(tiny_llama(seed=0))
    assert saved(kv, tuned, ids) == 2
    assert loaded(kv, base, ids) == 0                      # the same base weights, without the adapter
    with tuned.disable_adapter():                          # the PEFT model with its adapter off
        assert loaded(kv, tuned, ids) == 0
        assert saved(kv, tuned, ids) == 2
        assert loaded(kv, tuned, ids) == 512               # ... which is the base model: its own chunks
    assert loaded(kv, tuned, ids) == 512                   # and the adapter's are still its own


def test_two_adapters_of_one_model_never_share_chunks(kv):
    ids = prompt(600, seed=2)
    model = lora(tiny_llama(seed=0), "a", seed=1)
    lora(model, "b", seed=2)
    model.set_adapter("a")
    assert saved(kv, model, ids) == 2
    namespace_a = model_namespace(model, CHUNK)
    model.set_adapter("b")
    assert model_namespace(model, CHUNK) != namespace_a
    assert loaded(kv, model, ids) == 0
    model.set_adapter("a")
    assert loaded(kv, model, ids) == 512


def test_weights_changed_in_place_are_not_served_the_old_chunks(kv):
    ids = prompt(600, seed=3)
    model = tiny_llama(seed=0)
    assert saved(kv, model, ids) == 2
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.add_(0.01)
    weights_changed(model)
    assert loaded(kv, model, ids) == 0
