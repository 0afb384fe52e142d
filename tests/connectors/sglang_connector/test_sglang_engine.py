"""The HiCache backend inside a real SGLang engine (0.5.23's CPU path, in its own virtualenv), with a real daemon.

One engine at a time serves the module (a random-weight float32 Llama, HiCache host pool in SGLang's
`layer_first` layout, pages moved by the `direct` I/O backend); three are started in all (the restart test, then
the rewritten checkpoint). The reference outputs are the engine's own plain prefill of fresh prompts on an empty
daemon (no cached token from anywhere); every later load from kvstore must give the same greedy tokens and
log-probabilities within 1e-3.

The first two engines keep what was saved before a plain `/flush_cache` (``reset_on_flush`` false): the tests
flush SGLang's own caches to make it load from storage.
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import Any, Iterator

import pytest

from conftest import wait_for
from harness.engines.sandbox import engine_home_env
from harness.engines.sglang_real import (
    LOGPROB_TOL, PAGE, Engines, assert_same, hicache_flags, prompts, save_model, saved_pages, stored,
)
from support.engines.sglang_fixtures import engine_venv, engine_workdir, kv_daemon  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(900)   # an engine start takes minutes on a small, shared CPU machine
LENGTH = 600       # SGLang asks storage only when at least 256 prompt tokens miss its own caches


@pytest.fixture(scope="module")
def engines(engine_venv, engine_workdir, kv_daemon) -> Iterator[Engines]:
    model = save_model(engine_venv, os.path.join(engine_workdir, "model"), "dense", engine_home_env(engine_workdir))
    e = Engines(engine_venv, model, engine_workdir, hicache_flags(kv_daemon.address, reset_on_flush=False))
    yield e
    e.close()


BATCH = prompts(3, LENGTH, seed=1)


@pytest.fixture(scope="module")
def reference(engines, kv_daemon) -> list[dict[str, Any]]:
    """The plain-prefill outputs of BATCH (nothing cached anywhere yet), then stored in the daemon."""
    out = engines.current.generate(BATCH)
    assert [o["cached"] for o in out] == [0, 0, 0]
    assert wait_for(lambda: stored(kv_daemon) >= saved_pages(BATCH), timeout=60), stored(kv_daemon)
    return out


def test_loads_after_flush_cache_give_plain_prefill_outputs(engines, reference):
    engine = engines.current
    engine.flush_cache()
    out = engine.generate(BATCH)
    assert_same(out, reference)
    assert all(o["from_storage"] >= LENGTH - 2 * PAGE for o in out), [o["from_storage"] for o in out]


def test_cache_salt_and_extra_key_seed_the_page_keys(engines, reference, kv_daemon):
    """SGLang seeds its storage page chain with the request's `cache_salt` and `extra_key` (LoRA id included):
    a prompt saved under one salt is not loaded under another, nor without one."""
    engine = engines.current
    salted = prompts(1, LENGTH, seed=5)
    before = stored(kv_daemon)
    first = engine.generate(salted, cache_salt="tenant-a")
    assert first[0]["cached"] == 0
    assert wait_for(lambda: stored(kv_daemon) >= before + saved_pages(salted), timeout=60)
    for other in ({"cache_salt": "tenant-b"}, {}, {"extra_key": "tenant-a"}):
        engine.flush_cache()
        out = engine.generate(salted, **other)
        assert out[0]["from_storage"] == 0, other
        assert_same(out, first)
    engine.flush_cache()
    out = engine.generate(salted, cache_salt="tenant-a")
    assert out[0]["from_storage"] >= LENGTH - 2 * PAGE
    assert_same(out, first)


def test_daemon_killed_mid_run(engines, reference, kv_daemon):
    """The daemon dies while the engine loads from it: every request still completes with plain outputs; a new
    daemon on the same socket is found again and stores."""
    engine = engines.current
    engine.flush_cache()
    results: list[Any] = []
    run = threading.Thread(target=lambda: results.append(_try(engine.generate, BATCH)))
    run.start()
    kv_daemon.kill()
    run.join(300)
    assert results and not isinstance(results[0], BaseException), results
    assert_same(results[0], reference)
    engine.flush_cache()
    assert_same(engine.generate(BATCH), reference)   # the daemon is down: plain prefill, no failed request
    kv_daemon.start()
    fresh = prompts(2, LENGTH, seed=9)
    assert wait_for(lambda: (engine.generate(fresh[:1], 1), stored(kv_daemon))[1] > 0, timeout=60)


def test_engine_restart_loads_what_the_last_engine_saved(engines, reference, kv_daemon):
    assert wait_for(lambda: (engines.current.generate(BATCH, 1), stored(kv_daemon))[1] >= saved_pages(BATCH),
                    timeout=60)
    engine = engines.restart()
    out = engine.generate(BATCH)
    assert_same(out, reference)
    assert all(o["from_storage"] >= LENGTH - 2 * PAGE for o in out), [o["from_storage"] for o in out]


# -- the weights in the keys ------------------------------------------------------------------------------

UPDATED = prompts(2, LENGTH, seed=21)


@pytest.fixture(scope="module")
def new_weights(engines, engine_workdir) -> str:
    """The module's model with other weights (every tensor moved by seeded noise), in a directory of its own."""
    import torch
    from safetensors.torch import load_file, save_file

    directory = os.path.join(engine_workdir, "model-new")
    shutil.copytree(engines.model, directory)
    generator = torch.Generator().manual_seed(1)
    for name in os.listdir(directory):
        if name.endswith(".safetensors"):
            path = os.path.join(directory, name)
            tensors = load_file(path)
            save_file({k: t + 0.05 * torch.randn(t.shape, generator=generator, dtype=t.dtype)
                       for k, t in tensors.items()}, path, metadata={"format": "pt"})
    return directory


@pytest.fixture(scope="module")
def updated(engines, reference, new_weights, kv_daemon) -> dict[str, list[dict[str, Any]]]:
    """UPDATED's outputs under the module's weights ("old"), then after ``update_weights_from_disk`` to
    `new_weights` naming weight version "step-1" ("new"; SGLang flushes its caches after the update), each once
    its pages are stored."""
    engine = engines.current
    before = stored(kv_daemon)
    old = engine.generate(UPDATED)
    assert wait_for(lambda: stored(kv_daemon) >= before + saved_pages(UPDATED), timeout=120)
    engine.update_weights_from_disk(new_weights, weight_version="step-1")
    new = engine.generate(UPDATED)
    assert wait_for(lambda: stored(kv_daemon) >= before + 2 * saved_pages(UPDATED), timeout=120)
    return {"old": old, "new": new}


def test_update_weights_from_disk_loads_nothing_saved_before(engines, updated):
    """After ``update_weights_from_disk`` and its flush, the pages saved under the old weights are not loaded:
    the new weights' plain prefill, which its own later loads give again."""
    assert [o["cached"] for o in updated["new"]] == [0, 0]
    assert _differ(updated["new"], updated["old"])
    engine = engines.current
    engine.flush_cache()     # this engine keeps what was saved before a plain flush
    out = engine.generate(UPDATED)
    assert all(o["from_storage"] >= LENGTH - 2 * PAGE for o in out), [o["from_storage"] for o in out]
    assert_same(out, updated["new"])


def test_checkpoint_rewritten_at_one_path_misses_in_a_new_engine(engines, reference, updated, new_weights,
                                                                 kv_daemon):
    """The module's checkpoint rewritten in place with the new weights, a new engine on it (naming the weight
    version the update named, ``reset_on_flush`` left at its default): the old weights' pages are not loaded
    (the fingerprint follows the bytes); the pages the updated engine saved are (the same bytes and version, on
    another engine), with this fresh engine's plain-prefill outputs."""
    for name in os.listdir(new_weights):
        if name.endswith(".safetensors"):
            shutil.copyfile(os.path.join(new_weights, name), os.path.join(engines.model, name))
    engines.flags = [*hicache_flags(kv_daemon.address), "--weight-version", "step-1"]
    engine = engines.restart()
    out = engine.generate(BATCH)
    assert [o["from_storage"] for o in out] == [0, 0, 0]
    assert _differ(out, reference)
    shared = engine.generate(UPDATED)
    assert all(o["from_storage"] >= LENGTH - 2 * PAGE for o in shared), [o["from_storage"] for o in shared]
    assert_same(shared, updated["new"])
    plain = engine.generate(UPDATED, cache_salt="plain")
    assert [o["cached"] for o in plain] == [0, 0]
    assert_same(plain, updated["new"])


def test_flush_naming_no_new_weights_moves_the_epoch(engines, updated, kv_daemon):
    """By default a ``/flush_cache`` after which SGLang's record of its weights says nothing new (as after an
    ``update_weights_from_tensor`` naming no weight version) leaves nothing saved before loadable by this engine;
    nothing is deleted."""
    engine = engines.current
    held = stored(kv_daemon)
    engine.flush_cache()
    out = engine.generate(UPDATED)
    assert [o["from_storage"] for o in out] == [0, 0]
    assert_same(out, updated["new"])
    assert stored(kv_daemon) >= held


def _differ(got: list[dict[str, Any]], other: list[dict[str, Any]]) -> bool:
    """Whether some prompt's tokens or log-probabilities differ (other weights, not rounding)."""
    return any(g["tokens"] != o["tokens"] or max(abs(a - b) for a, b in zip(g["logprobs"], o["logprobs"]))
               > 100 * LOGPROB_TOL for g, o in zip(got, other))


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the test thread to report
        return exc
