"""A chunk is keyed by everything that shapes its KV, in real vLLM engines (the CPU build) with a real daemon.

Each case runs the same token ids where the KV differs: under two LoRA adapters and none, as two sets of prompt
embeddings, after an in-place weight update and ``reset_prefix_cache(reset_connector=True)``, from a checkpoint
rewritten at the same path, and after two images and none in a vision-language model. Every output is compared with
plain prefill (an engine with no connector and no prefix caching, given the same adapter, embeddings or weights):
the same greedy tokens, the same log-probabilities to float32 rounding; and the counters say what was loaded. Two
engines serve the whole module (the plain reference and the engine under test, both with adapters and prompt
embeddings on), over a checkpoint of its own, and the vision-language case two of its own: an engine start takes
minutes on a loaded machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from conftest import wait_for
from harness.engines.vllm_real import (
    CHUNK, ENGINE_SCRIPT, REPO, EngineProc, assert_same, delta, engine_python, full_chunks, prompts, stored,
)
from support.engines.vllm_fixtures import engine_venv, pool  # noqa: F401 - fixtures

LORA_RANK = 8
IDENTITY = {"lora": LORA_RANK, "prompt_embeds": True}   # the engines of this module: adapters and embeddings on
pytestmark = pytest.mark.timeout(1800)   # engine starts of minutes each when the machine is busy


@pytest.fixture(scope="module")
def checkpoint(pool) -> str:
    """The module's own random-weight checkpoint (seed 0), which one test rewrites in place."""
    path = os.path.join(pool.workdir, "model-identity")
    save_checkpoint(path, seed=0)
    return path


@pytest.fixture
def kv_daemon(start_daemon, pool):
    return start_daemon("--host-mem", "256MiB", workdir=pool.workdir)


def plain_of(pool, checkpoint: str) -> EngineProc:
    return pool.get("identity-plain", model=checkpoint, prefix_caching=False, **IDENTITY)


def with_store(pool, checkpoint: str) -> EngineProc:
    return pool.get("identity", model=checkpoint, connector=pool.connector(), **IDENTITY)


def reconnected(engine: EngineProc, daemon: Any) -> int:
    """Once the engine's links have found this test's daemon (the engines outlive each test's daemon: a save on
    a link to the stopped one is lost), the chunks the daemon holds."""
    warm = prompts(1, CHUNK + 10, seed=999)
    assert wait_for(lambda: (engine.generate(warm, max_tokens=1), stored(daemon))[1] > 0, timeout=60)
    return stored(daemon)


def loads_of(engine: EngineProc, batch: list[list[int]], **kw: Any) -> tuple[list[dict[str, Any]], int]:
    """Generate `batch` after vLLM forgot its own cache; returns (outputs, chunks loaded)."""
    engine.reset_prefix_cache()
    before = engine.stats()
    out = engine.generate(batch, **kw)
    after = engine.stats()
    assert delta(after, before, "worker", "load_failures") == 0
    return out, delta(after, before, "worker", "chunks_loaded")


def write_adapter(directory: str, seed: int, hidden: int = 128, kv_out: int = 64, layers: int = 4) -> str:
    """A random LoRA adapter (PEFT's files) of the pool's dense model on its K and V projections, with a
    non-zero lora_B so that it changes the KV."""
    os.makedirs(directory, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for proj in ("k_proj", "v_proj"):
            name = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(LORA_RANK, hidden, generator=g) * 0.1
            tensors[f"{name}.lora_B.weight"] = torch.randn(kv_out, LORA_RANK, generator=g) * 0.1
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": LORA_RANK, "lora_alpha": 16, "lora_dropout": 0.0, "bias": "none",
              "target_modules": ["k_proj", "v_proj"], "task_type": "CAUSAL_LM", "base_model_name_or_path": None}
    Path(directory, "adapter_config.json").write_text(json.dumps(config))
    return directory


def differs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return any(x["tokens"] != y["tokens"] or abs(x["logprobs"][0] - y["logprobs"][0]) > 1e-2 for x, y in zip(a, b))


def test_lora_adapters_and_the_base_model_never_share_chunks(pool, checkpoint, kv_daemon):
    work = tempfile.mkdtemp(prefix="lora-", dir=pool.workdir)
    a = {"name": "a", "id": 1, "path": write_adapter(os.path.join(work, "a"), seed=1)}
    b = {"name": "b", "id": 2, "path": write_adapter(os.path.join(work, "b"), seed=2)}
    a_again = {"name": "a-copy", "id": 3, "path": shutil.copytree(a["path"], os.path.join(work, "a-copy"))}
    batch = prompts(1, 1100, seed=101)
    ref = plain_of(pool, checkpoint)
    want_a, want_b, want_base = (ref.generate(batch, loras=[lora]) for lora in (a, b, None))
    assert differs(want_a, want_b) and differs(want_a, want_base)   # the adapters change the output
    engine = with_store(pool, checkpoint)
    held = reconnected(engine, kv_daemon)
    assert_same(engine.generate(batch, loras=[a]), want_a)
    assert wait_for(lambda: stored(kv_daemon) == held + full_chunks(batch))
    for lora, want in ((b, want_b), (None, want_base)):
        out, loaded = loads_of(engine, batch, loras=[lora])
        assert_same(out, want)
        assert loaded == 0
    out, loaded = loads_of(engine, batch, loras=[a_again])   # the same adapter's bytes under another name and path
    assert_same(out, want_a)
    assert loaded == full_chunks(batch)


def test_prompt_embeddings_are_keyed_by_their_values(pool, checkpoint, kv_daemon):
    batch = prompts(1, 1100, seed=111)   # as embeddings every position's token id is 0
    first, second = [{"seed": 1}], [{"seed": 2}]
    ref = plain_of(pool, checkpoint)
    want_first, want_second = ref.generate(batch, embeds=first), ref.generate(batch, embeds=second)
    engine = with_store(pool, checkpoint)
    held = reconnected(engine, kv_daemon)
    assert_same(engine.generate(batch, embeds=first), want_first)
    assert wait_for(lambda: stored(kv_daemon) == held + full_chunks(batch))
    out, loaded = loads_of(engine, batch, embeds=second)
    assert_same(out, want_second)
    assert loaded == 0
    out, loaded = loads_of(engine, batch, embeds=first)
    assert_same(out, want_first)
    assert loaded == full_chunks(batch)


def save_checkpoint(path: str, seed: int) -> None:
    python = engine_python()
    assert python is not None
    subprocess.run([python, str(ENGINE_SCRIPT), "save-model", path, "dense", "128", "4", str(seed)], check=True,
                   env=pool_env(), cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)


def pool_env() -> dict[str, str]:
    from harness.engines.vllm_real import POOL

    return POOL.env()


def model_identities(*cases: tuple[str, dict[str, Any]]) -> list[str]:
    """The connector's model identity of each (model directory, engine arguments), from one engine interpreter."""
    python = engine_python()
    assert python is not None
    done = subprocess.run([python, str(ENGINE_SCRIPT), "model-identity", json.dumps(cases)],
                          check=True, env=pool_env(), cwd=str(REPO), capture_output=True, text=True, timeout=300)
    found = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("identity ")]
    assert len(found) == len(cases), done.stdout + done.stderr
    return found


def test_every_setting_that_changes_kv_changes_the_model_identity(pool):
    path = os.path.join(pool.workdir, "model-settings")
    save_checkpoint(path, seed=5)
    copy = shutil.copytree(path, os.path.join(pool.workdir, "model-settings-copy"))
    base, same, *changed, unsampled = model_identities(
        (path, {}), (copy, {}),
        (path, {"hf_overrides": {"rope_theta": 20000.0}}),
        (path, {"hf_overrides": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}}),
        (path, {"kv_cache_dtype": "fp8"}),
        (path, {"fingerprint": "off"}))
    assert same == base                                     # the same bytes elsewhere: the same identity
    assert len({base, *changed}) == 1 + len(changed)
    assert unsampled.split(".")[1] == base.split(".")[1]    # weights part only


def test_checkpoint_rewritten_at_the_same_path_loads_nothing_of_the_old_weights(pool, checkpoint, kv_daemon):
    batch = prompts(2, 1100, seed=131)
    old = with_store(pool, checkpoint)
    held = reconnected(old, kv_daemon)
    old.generate(batch)                                    # the checkpoint's first weights: saved
    assert wait_for(lambda: stored(kv_daemon) == held + full_chunks(batch))
    pool.keep()
    save_checkpoint(checkpoint, seed=1)                    # new weights, the same config, at the same path
    want = plain_of(pool, checkpoint).generate(batch)
    engine = with_store(pool, checkpoint)
    before = engine.stats()
    assert_same(engine.generate(batch), want)
    assert delta(engine.stats(), before, "worker", "chunks_loaded") == 0


def test_weights_updated_in_place_then_reset_load_nothing_saved_before(pool, checkpoint, kv_daemon):
    batch = prompts(2, 1100, seed=121)
    version = [{"kvstore_weights_version": "step-1"}] * len(batch)
    ref = plain_of(pool, checkpoint)
    ref.call("update_weights", seed=7)
    want_new = ref.generate(batch)
    engine = with_store(pool, checkpoint)
    held = reconnected(engine, kv_daemon)
    engine.generate(batch)                                  # the checkpoint's weights: saved
    assert wait_for(lambda: stored(kv_daemon) == held + full_chunks(batch))
    engine.call("update_weights", seed=7)
    engine.call("reset_prefix_cache", reset_connector=True)
    before = engine.stats()
    assert_same(engine.generate(batch), want_new)
    assert delta(engine.stats(), before, "worker", "chunks_loaded") == 0
    assert stored(kv_daemon) >= held + full_chunks(batch)   # nothing was deleted
    # Engines given the same new weights share them under a version their requests name.
    assert_same(engine.generate(batch, kv_transfer_params=version), want_new)
    assert wait_for(lambda: stored(kv_daemon) == held + 3 * full_chunks(batch))
    engine.call("reset_prefix_cache", reset_connector=True)   # another update: the engine's own epoch moves on
    before = engine.stats()
    out = engine.generate(batch, kv_transfer_params=version)
    assert_same(out, want_new)
    assert delta(engine.stats(), before, "worker", "chunks_loaded") == full_chunks(batch)
    assert engine.stats()["scheduler"]["resets"] == 2
    pool.keep()   # the engines' weights are no longer their checkpoint's


def test_images_are_keyed_by_their_content_in_a_vision_language_model(pool, kv_daemon):
    """A BLIP-2 shaped model (``vllm_engine.save_vlm``) whose processor puts an image's placeholders before the
    prompt: the same token ids after another image, or none, load nothing; after the same image, every chunk."""
    batch = prompts(1, 568, seed=131)   # with the image's 32 placeholders, two chunks and some
    ref = pool.get("vlm-plain", family="vlm", prefix_caching=False, images=1)
    want = {image: ref.generate(batch, images=[image]) for image in (1, 2, None)}
    for other in (2, None):   # the image changes the output, far beyond rounding
        assert max(abs(a - b) for a, b in zip(want[1][0]["logprobs"], want[other][0]["logprobs"])) > 1e-2
    engine = pool.get("vlm", family="vlm", connector=pool.connector(), images=1)
    held = reconnected(engine, kv_daemon)
    assert_same(engine.generate(batch, images=[1]), want[1])
    chunks = (len(batch[0]) + 32 - 1) // CHUNK
    assert wait_for(lambda: stored(kv_daemon) == held + chunks)
    for image in (2, None):
        out, loaded = loads_of(engine, batch, images=[image])
        assert_same(out, want[image])
        assert loaded == 0
    out, loaded = loads_of(engine, batch, images=[1])
    assert_same(out, want[1])
    assert loaded == chunks
    pool.keep()
