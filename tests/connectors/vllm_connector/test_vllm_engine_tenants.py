"""Tenants in a real vLLM engine (the CPU build, in its own virtualenv), with a real daemon.

vLLM's `cache_salt` (a prompt's ``{"prompt_token_ids": [...], "cache_salt": "..."}``) is part of every chunk key
the connector derives: requests with different salts (or one with a salt and one without) never share a chunk,
even for the same prompt, and a request with a saved request's salt loads its chunks. Every output equals plain
prefill's (tokens and log-probabilities).

A request whose ``kv_transfer_params`` say ``{"kvstore_retention": "no-store"}`` saves nothing it computes, and
still loads what is stored; one whose ``kv_transfer_params`` say ``{"kvstore_retention": "pin"}`` keeps its chunks
in the daemon's DRAM through a flood that evicts an unpinned request's.
"""

from __future__ import annotations

import os
import tempfile

import pytest

from conftest import wait_for
from harness.engines.vllm_real import (
    assert_same, delta, full_chunks, plain, prompts, stored,
)
from support.engines.vllm_fixtures import engine_venv, pool  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(900)   # engine starts of minutes each on a small, shared CPU machine

MAX_TOKENS = 4


@pytest.fixture
def kv_daemon(start_daemon, pool):
    """A daemon on the engines' socket, with a disk tier of its own."""
    disk = tempfile.mkdtemp(prefix="disk-", dir=pool.workdir)
    return start_daemon("--disk-dir", disk, "--host-mem", "256MiB", workdir=pool.workdir)


def chunks_loaded(engine, batch, salt: str | None, want) -> int:
    """Run `batch` with cache salt `salt` after vLLM forgot its own cache; check the outputs against plain
    prefill's and return how many chunks the connector loaded from the daemon."""
    engine.reset_prefix_cache()
    before = engine.stats()
    out = engine.generate(batch, MAX_TOKENS, salts=[salt] * len(batch))
    after = engine.stats()
    assert_same(out, want)
    assert delta(after, before, "worker", "load_failures") == 0
    return delta(after, before, "worker", "chunks_loaded")


def test_cache_salt_separates_chunks_of_the_same_prompt(pool, kv_daemon):
    batch = prompts(1, 600, seed=91)
    n = full_chunks(batch)
    want = plain(pool).generate(batch, MAX_TOKENS)
    engine = pool.get("a", connector=pool.connector())

    assert chunks_loaded(engine, batch, "tenant-a", want) == 0
    assert wait_for(lambda: stored(kv_daemon) == n)
    assert chunks_loaded(engine, batch, "tenant-b", want) == 0   # another salt shares nothing
    assert wait_for(lambda: stored(kv_daemon) == 2 * n)          # and is saved apart
    assert chunks_loaded(engine, batch, None, want) == 0         # no salt never reads a salted chunk
    assert wait_for(lambda: stored(kv_daemon) == 3 * n)

    assert chunks_loaded(engine, batch, "tenant-a", want) == n   # the same salt loads what it saved
    assert chunks_loaded(engine, batch, "tenant-b", want) == n
    assert chunks_loaded(engine, batch, None, want) == n
    assert stored(kv_daemon) == 3 * n                            # loads saved nothing again

    salts: list[str | None] = ["tenant-a", "tenant-b", None]
    keys = engine.chunk_keys(batch * len(salts), salts=salts)
    assert len({key for chain in keys for key in chain}) == len(salts) * n
    with engine.chunk_client(kv_daemon) as c:
        assert [c.lookup(chain) for chain in keys] == [n] * len(salts)


def test_no_store_request_saves_nothing_and_still_loads(pool, kv_daemon):
    quiet, normal = prompts(2, 600, seed=92)
    want = plain(pool).generate([quiet, normal], MAX_TOKENS)
    engine = pool.get("a", connector=pool.connector())
    no_store = {"kvstore_retention": "no-store"}

    engine.reset_prefix_cache()
    before = engine.stats()
    assert_same(engine.generate([quiet, normal], MAX_TOKENS, kv_transfer_params=[no_store, None]), want)
    assert wait_for(lambda: stored(kv_daemon) == full_chunks([normal]))   # only the normal request saved
    assert delta(engine.stats(), before, "scheduler", "save_specs") == 1
    keys = engine.chunk_keys([quiet])[0]
    with engine.chunk_client(kv_daemon) as c:
        assert c.lookup(keys) == 0

    engine.reset_prefix_cache()                          # no-store loads what another request saved
    before = engine.stats()
    assert_same(engine.generate([normal], MAX_TOKENS, kv_transfer_params=[no_store]), want[1:])
    after = engine.stats()
    assert delta(after, before, "worker", "chunks_loaded") == full_chunks([normal])
    assert delta(after, before, "scheduler", "save_specs") == 0
    assert stored(kv_daemon) == full_chunks([normal])


@pytest.fixture
def tight_daemon(start_daemon, pool):
    """A daemon on the engines' socket whose DRAM a flood fills, with no disk tier to demote into."""
    return start_daemon("--host-mem", "64MiB", "--disk-size", "0", "--max-pin-share", "0.5", workdir=pool.workdir)


def test_a_pinned_requests_chunks_survive_a_flood_that_evicts_an_unpinned_ones(pool, tight_daemon):
    pinned, unpinned = prompts(2, 600, seed=93)
    engine = pool.get("a", connector=pool.connector())
    pin = {"kvstore_retention": "pin", "kvstore_pin_ttl": 600}
    engine.generate([pinned, unpinned], MAX_TOKENS, kv_transfer_params=[pin, None])
    n = full_chunks([pinned])
    assert wait_for(lambda: stored(tight_daemon) == 2 * n)
    with tight_daemon.client() as c:
        retention = c.stats()["retention"]
        assert retention["pinned_chunks"] == n
        chunk = retention["pinned_bytes"] // n
        for _ in range(2 * (64 << 20) // chunk):   # twice the tier in one-chunk puts of another namespace
            c.put([os.urandom(16)], [b"f" * chunk])
    keys = engine.chunk_keys([pinned, unpinned])
    with engine.chunk_client(tight_daemon) as c:
        assert [c.lookup(chain) for chain in keys] == [n, 0]
