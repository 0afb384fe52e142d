"""The HiCache backend with an MLA model (DeepSeek-V2-shaped, random float32 weights) in a real SGLang engine.

SGLang's CPU path runs MLA with the torch-native attention backend; its host pool is then
`MLATokenToKVPoolHost` (one latent-plus-rope row per token per layer), in the `layer_first` layout moved by the
`direct` I/O backend. The reference is the engine's own plain prefill on an empty daemon.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from conftest import wait_for
from support.engines.sandbox import engine_home_env
from support.engines.sglang_real import (
    PAGE, Engines, assert_same, hicache_flags, prompts, save_model, saved_pages, stored,
    engine_venv, engine_workdir, kv_daemon,  # noqa: F401 - fixtures
)

pytestmark = pytest.mark.timeout(900)   # an engine start takes minutes on a small, shared CPU machine
LENGTH = 600


@pytest.fixture(scope="module")
def engines(engine_venv, engine_workdir, kv_daemon) -> Iterator[Engines]:
    model = save_model(engine_venv, os.path.join(engine_workdir, "model"), "mla", engine_home_env(engine_workdir))
    e = Engines(engine_venv, model, engine_workdir, hicache_flags(kv_daemon.address))
    yield e
    e.close()


def test_mla_pages_load_after_flush_cache(engines, kv_daemon):
    engine = engines.current
    batch = prompts(2, LENGTH, seed=3)
    want = engine.generate(batch)
    assert [o["cached"] for o in want] == [0, 0]
    assert wait_for(lambda: stored(kv_daemon) >= saved_pages(batch), timeout=60), stored(kv_daemon)
    engine.flush_cache()
    out = engine.generate(batch)
    assert_same(out, want)
    assert all(o["from_storage"] >= LENGTH - 2 * PAGE for o in out), [o["from_storage"] for o in out]
