"""The vLLM connector inside real vLLM engines (the CPU build, in its own virtualenv), with a real daemon.

Every output is checked against the same prompts run by a plain engine (no connector, no prefix caching):
the same greedy tokens, and the same log-probabilities to float32 rounding. Engines are shared by the whole
session (``engines.vllm_real.POOL``); every test brings a fresh daemon on the socket they are configured with.
"""

from __future__ import annotations

import os
import tempfile

import pytest

from engines.vllm_real import CHUNK, POOL, engine_python, prompts, skip_reason

pytestmark = pytest.mark.skipif(engine_python() is None, reason=skip_reason())

LOGPROB_TOL = 1e-3


@pytest.fixture(scope="session")
def pool():
    yield POOL
    POOL.close()


@pytest.fixture
def kv_daemon(start_daemon, pool):
    """A daemon on the engines' socket, with a disk tier of its own."""
    disk = tempfile.mkdtemp(prefix="disk-", dir=pool.workdir)
    return start_daemon("--disk-dir", disk, "--host-mem", "256MiB", workdir=pool.workdir)


def plain(pool):
    return pool.get("plain", prefix_caching=False)


def with_store(pool, name: str = "a", **config):
    return pool.get(name, connector=pool.connector(), **config)


def assert_same(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g["tokens"] == w["tokens"], f"prompt {i}: tokens differ"
        assert len(g["logprobs"]) == len(w["logprobs"])
        worst = max(abs(a - b) for a, b in zip(g["logprobs"], w["logprobs"]))
        assert worst <= LOGPROB_TOL, f"prompt {i}: log-probabilities differ by {worst}"


def hit_tokens(daemon) -> int:
    with daemon.client() as c:
        return int(c.stats()["hit_tokens"])


def test_second_engine_loads_what_the_first_saved(pool, kv_daemon):
    batch = prompts(4, 1100, seed=1)
    want = plain(pool).generate(batch)
    assert_same(with_store(pool, "a").generate(batch), want)
    with kv_daemon.client() as c:
        assert c.stats()["chunks"] == 4 * (1100 // CHUNK)
    before = hit_tokens(kv_daemon)
    b = with_store(pool, "b")
    moved = b.stats()
    assert_same(b.generate(batch), want)
    assert hit_tokens(kv_daemon) - before == 4 * (1100 // CHUNK) * CHUNK
    assert delta(b.stats(), moved, "worker", "chunks_loaded") == 4 * (1100 // CHUNK)
    assert delta(b.stats(), moved, "worker", "load_failures") == 0


def delta(after: dict, before: dict, side: str, name: str) -> int:
    return after.get(side, {}).get(name, 0) - before.get(side, {}).get(name, 0)
