"""kv_producer and kv_consumer in real vLLM engines: prefill on one, decode on another, one daemon between.

The two engines and the router (``bench/vllm_router.py``) give the same tokens and log-probabilities as one
plain engine; the producer never loads (even what is stored), the consumer never saves.
"""

from __future__ import annotations

import tempfile

import pytest

from bench.vllm_router import route
from conftest import wait_for
from harness.engines.vllm_real import (
    assert_same, delta, full_chunks, plain, prompts, stored,
)
from support.engines.vllm_fixtures import engine_venv, pool  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(900)   # engine starts of minutes each on a small, shared CPU machine


def test_prefill_engine_and_decode_engine_share_one_daemon(pool, start_daemon):
    batch = prompts(4, 1100, seed=81)
    want = plain(pool).generate(batch, 16)
    pool.keep("plain")  # at most three engines at a time
    daemon = start_daemon("--disk-dir", tempfile.mkdtemp(prefix="disk-", dir=pool.workdir), "--host-mem", "256MiB",
                          workdir=pool.workdir)
    prefill = pool.get("prefill", connector=pool.connector("kv_producer"))
    decode = pool.get("decode", connector=pool.connector("kv_consumer"))
    p0, d0 = prefill.stats(), decode.stats()
    assert_same(route(prefill, decode, batch, 16), want)
    p1, d1 = prefill.stats(), decode.stats()
    assert delta(d1, d0, "worker", "chunks_loaded") == full_chunks(batch)
    assert delta(d1, d0, "scheduler", "save_specs") == 0 and delta(d1, d0, "worker", "chunks_saved") == 0
    assert delta(p1, p0, "worker", "chunks_saved") == full_chunks(batch)
    assert wait_for(lambda: stored(daemon) == full_chunks(batch))

    prefill.reset_prefix_cache()  # the producer runs it all again: stored, but it never loads
    prefill.generate(batch, 1)
    p2 = prefill.stats()
    assert delta(p2, p1, "scheduler", "load_specs") == 0 and delta(p2, p1, "worker", "chunks_loaded") == 0
