"""The HiCache backend inside a real SGLang engine (0.5.23's CPU path, in its own virtualenv), with a real daemon.

One engine serves the module (a random-weight float32 Llama, HiCache host pool in SGLang's `layer_first`
layout, pages moved by the `direct` I/O backend). The reference outputs are the engine's own plain prefill of
fresh prompts on an empty daemon (no cached token from anywhere); every later load from kvstore must give the
same greedy tokens and log-probabilities within 1e-3.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterator

import pytest

from conftest import wait_for
from support.engines.sandbox import engine_home_env
from support.engines.sglang_real import (
    PAGE, Engines, assert_same, hicache_flags, prompts, save_model, saved_pages, stored,
    engine_venv, engine_workdir, kv_daemon,  # noqa: F401 - fixtures
)

pytestmark = pytest.mark.timeout(900)   # an engine start takes minutes on a small, shared CPU machine
LENGTH = 600       # SGLang asks storage only when at least 256 prompt tokens miss its own caches


@pytest.fixture(scope="module")
def engines(engine_venv, engine_workdir, kv_daemon) -> Iterator[Engines]:
    model = save_model(engine_venv, os.path.join(engine_workdir, "model"), "dense", engine_home_env(engine_workdir))
    e = Engines(engine_venv, model, engine_workdir, hicache_flags(kv_daemon.address))
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


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the test thread to report
        return exc
