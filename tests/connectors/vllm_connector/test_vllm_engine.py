"""The vLLM connector inside real vLLM engines (the CPU build, in its own virtualenv), with a real daemon.

Every output is checked against the same prompts run by a plain engine (no connector, no prefix caching):
the same greedy tokens, and the same log-probabilities to float32 rounding. Engines are shared by the whole
session (``engines.vllm_real.POOL``); every test brings a fresh daemon on the socket they are configured with.
"""

from __future__ import annotations

import tempfile

import pytest

from conftest import wait_for
from harness.engines.vllm_real import (
    CHUNK, assert_same, delta, full_chunks, plain, prompts, stored,
)
from support.engines.vllm_fixtures import engine_venv, pool  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(900)   # engine starts of minutes each on a small, shared CPU machine


@pytest.fixture
def kv_daemon(start_daemon, pool):
    """A daemon on the engines' socket, with a disk tier of its own."""
    disk = tempfile.mkdtemp(prefix="disk-", dir=pool.workdir)
    return start_daemon("--disk-dir", disk, "--host-mem", "256MiB", workdir=pool.workdir)


def with_store(pool, name: str = "a", **config):
    return pool.get(name, connector=pool.connector(), **config)


def small(pool):
    """A token budget of 512 (longer prompts prefill in chunks) and 24 blocks of KV cache (3,072 tokens, one of them
    vLLM's null block)."""
    return pool.get("small", connector=pool.connector(), max_num_batched_tokens=512, num_blocks=24,
                    max_model_len=2048)


def loads_of(engine, batch, max_tokens: int = 8, **kw):
    """Generate `batch` after vLLM forgot its own cache; returns (outputs, chunks loaded, failed loads)."""
    engine.reset_prefix_cache()
    before = engine.stats()
    out = engine.generate(batch, max_tokens, **kw)
    after = engine.stats()
    return out, delta(after, before, "worker", "chunks_loaded"), delta(after, before, "worker", "load_failures")


def test_daemon_absent_at_engine_start(pool, start_daemon):
    batch = prompts(3, 700, seed=11)
    want = plain(pool).generate(batch)
    a = with_store(pool, "a")                        # no daemon on the socket (yet)
    assert_same(a.generate(batch), want)
    daemon = start_daemon("--disk-dir", tempfile.mkdtemp(prefix="disk-", dir=pool.workdir), workdir=pool.workdir)
    assert wait_for(lambda: (a.generate(batch[:1], 1), stored(daemon))[1] > 0, timeout=30)
    assert_same(a.generate(batch), want)
    assert wait_for(lambda: stored(daemon) == full_chunks(batch))
    out, loaded, failed = loads_of(a, batch)
    assert_same(out, want)
    assert (loaded, failed) == (full_chunks(batch), 0)




def test_second_engine_loads_what_the_first_saved(pool, kv_daemon):
    batch = prompts(4, 1100, seed=1)
    want = plain(pool).generate(batch)
    assert_same(with_store(pool, "a").generate(batch), want)
    assert wait_for(lambda: stored(kv_daemon) == 4 * (1100 // CHUNK))
    b = with_store(pool, "b")
    moved = b.stats()
    assert_same(b.generate(batch), want)
    assert delta(b.stats(), moved, "worker", "chunks_loaded") == 4 * (1100 // CHUNK)
    assert delta(b.stats(), moved, "worker", "load_failures") == 0
    with kv_daemon.client() as c:   # the worker timed its loads from DRAM and told the daemon (routers read it)
        assert wait_for(lambda: c.stats()["load_ns_per_kib"].get("CPU", 0) > 0)


def test_concurrent_batch_with_and_without_hits(pool, kv_daemon):
    hits, misses = prompts(4, 900, seed=21), prompts(4, 900, seed=22)
    mixed = [p for pair in zip(hits, misses) for p in pair]
    want = plain(pool).generate(mixed)
    with_store(pool, "a").generate(hits)
    assert wait_for(lambda: stored(kv_daemon) == full_chunks(hits))
    b = with_store(pool, "b")
    b.reset_prefix_cache()
    before = b.stats()
    assert_same(b.generate(mixed), want)
    after = b.stats()
    assert delta(after, before, "worker", "chunks_loaded") == full_chunks(hits)
    assert delta(after, before, "scheduler", "load_specs") == len(hits)
    assert wait_for(lambda: stored(kv_daemon) == full_chunks(mixed))  # the misses were saved meanwhile


def test_chunked_prefill_of_prompts_longer_than_the_token_budget(pool, kv_daemon):
    batch = prompts(2, 1800, seed=31)
    want = plain(pool).generate(batch)
    engine = small(pool)
    assert_same(engine.generate(batch), want)     # 1,800 tokens in steps of 512: chunks saved as they fill
    assert wait_for(lambda: stored(kv_daemon) == full_chunks(batch))
    out, loaded, failed = loads_of(engine, batch)
    assert_same(out, want)
    assert (loaded, failed) == (full_chunks(batch), 0)


def test_preemption_and_resumption_under_kv_cache_pressure(pool, kv_daemon):
    # Four of these fit at 600 tokens (5 blocks each) and outgrow the cache as they decode (7 blocks each).
    batch = prompts(5, 600, seed=41)
    want = plain(pool).generate(batch, 250)
    engine = small(pool)
    before = engine.stats()
    assert_same(engine.generate(batch, 250), want)
    assert delta(engine.stats(), before, "scheduler", "preempted") > 0
    out, loaded, failed = loads_of(engine, batch, 250)
    assert_same(out, want)
    assert loaded >= full_chunks(batch) and failed == 0


def test_request_aborted_while_its_load_is_in_flight(pool, kv_daemon):
    batch = prompts(3, 1100, seed=51)
    want = plain(pool).generate(batch)
    a = with_store(pool, "a")
    a.generate(batch)
    out, _, _ = loads_of(a, batch, abort={"0": 1})  # after the step that admitted it, before it ran
    assert out[0]["finished"] == "aborted"
    assert_same(out[1:], want[1:])
    out, loaded, failed = loads_of(a, batch)       # nothing leaked: the same requests load and run again
    assert_same(out, want)
    assert (loaded, failed) == (full_chunks(batch), 0)


def test_chunk_deleted_between_lookup_and_load_is_recomputed(pool, kv_daemon):
    long_new, stored_one = prompts(1, 1800, seed=61)[0], prompts(1, 1100, seed=62)[0]
    want = plain(pool).generate([long_new, stored_one])
    engine = small(pool)
    engine.generate([stored_one])
    keys = engine.chunk_keys([stored_one])[0]
    engine.reset_prefix_cache()

    def delete_the_tail():
        # The scheduler looked up both requests in the first step; the stored one is admitted steps later.
        with engine.chunk_client(kv_daemon) as c:
            assert c.delete(keys[2:]) == len(keys) - 2

    before = engine.stats()
    out = engine.generate_with_pause([long_new, stored_one], pause_after=1, during=delete_the_tail)
    assert_same(out, want)
    after = engine.stats()
    assert delta(after, before, "worker", "load_failures") == 1
    assert delta(after, before, "worker", "chunks_loaded") == 2


def test_engine_rides_through_a_warm_restart_and_loads_what_it_saved_before(pool, start_daemon):
    """SIGTERM and a new daemon on the socket while the engine keeps running. No disk tier: what the engine
    loads afterwards is the DRAM tier the new daemon adopted, once each chunk matched its checksum."""
    daemon = start_daemon("--adopt", "--disk-size", "0", "--host-mem", "256MiB", workdir=pool.workdir)
    batch = prompts(3, 700, seed=75)
    want = plain(pool).generate(batch)
    a = with_store(pool, "a")
    assert_same(a.generate(batch), want)
    assert wait_for(lambda: stored(daemon) == full_chunks(batch))
    daemon.restart()
    assert wait_for(lambda: stored(daemon) == full_chunks(batch))   # adopted, verified

    def loads_everything() -> bool:
        out, loaded, failed = loads_of(a, batch)
        assert_same(out, want)   # a prefill while the connector reconnects, a load after: the same tokens
        return (loaded, failed) == (full_chunks(batch), 0)

    assert wait_for(loads_everything, timeout=60, interval=0.5)
    daemon.restart_without_adopting()   # the engine outlives this test and maps the arena


def test_daemon_killed_and_restarted_mid_run(pool, kv_daemon):
    batch, later = prompts(4, 1100, seed=71), prompts(4, 1100, seed=72)
    want, want_later = plain(pool).generate(batch, 16), plain(pool).generate(later)
    a = with_store(pool, "a")

    def restart():
        kv_daemon.kill()
        kv_daemon.start()

    out = a.generate_with_pause(batch, pause_after=2, during=restart, max_tokens=16)
    assert [o["finished"] for o in out] == ["length"] * 4
    assert_same(out, want)
    assert_same(a.generate(later), want_later)      # saved into the restarted daemon
    assert wait_for(lambda: stored(kv_daemon) >= full_chunks(later))
    out, loaded, failed = loads_of(a, later)
    assert_same(out, want_later)
    assert (loaded, failed) == (full_chunks(later), 0)
