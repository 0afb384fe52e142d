"""Online verification in a real vLLM engine: `verify_fraction` 1.0 computes every would-be hit and compares it.

One engine saves the prompts; another process of the same user flips a byte of some stored chunks in the
shared arena (`scribble.py`); an engine that verifies every hit must give plain prefill's tokens and
log-probabilities, and the daemon must have counted the mismatches and dropped the damaged chains. With clean
chunks it counts the checks and no mismatch. The daemon has no disk tier here: a write-back would find the
damage by its checksum first, and this test is about what the engine's comparison finds.
"""

from __future__ import annotations

from typing import Any

import pytest

from conftest import wait_for
from harness.engines.vllm_real import (
    assert_same, delta, full_chunks, plain, prompts, stored,
)
from support.engines.vllm_fixtures import engine_venv, pool  # noqa: F401 - fixtures
from support.scribble import damage

pytestmark = pytest.mark.timeout(900)   # engine starts of minutes each on a small, shared CPU machine

FLOAT_TOP_BYTE = 67   # the top byte (sign, exponent) of a float32 deep in the chunk's first block


@pytest.fixture
def kv_daemon(start_daemon, pool):
    return start_daemon("--host-mem", "256MiB", "--disk-size", "0", workdir=pool.workdir)


def saver(pool):
    return pool.get("a", connector=pool.connector())


def verifier(pool):
    return pool.get("verify", connector=pool.connector(verify_fraction=1.0))


def verify_counts(daemon) -> dict[str, Any]:
    with daemon.client() as c:
        return dict(c.stats()["verify"])


def save_then_verify(pool, daemon, batch, damaged_chunk: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Save `batch` with one engine, damage chunk `damaged_chunk` of each prompt (None: none), run it through the
    verifying engine; returns the daemon's `verify` counts before and after, once every comparison is in."""
    want = plain(pool).generate(batch)
    assert_same(saver(pool).generate(batch), want)
    assert wait_for(lambda: stored(daemon) == full_chunks(batch), timeout=30), (stored(daemon), saver(pool).stats())
    v = verifier(pool)
    if damaged_chunk is not None:
        keys = v.chunk_keys(batch)
        with v.chunk_client(daemon) as c:
            assert wait_for(lambda: c.stats()["integrity"]["sums_pending"] == 0)  # damage after commit and sums
            payloads = []
            for chain in keys:
                with c.get(chain[damaged_chunk:damaged_chunk + 1]) as views:
                    payloads.append(bytes(views[0]))
            damage(c.server_info["arena"]["path"], payloads, offset=FLOAT_TOP_BYTE)
    v.reset_prefix_cache()
    before, moved = verify_counts(daemon), v.stats()
    assert_same(v.generate(batch), want)
    assert wait_for(lambda: delta(v.stats(), moved, "worker", "chunks_verified") == full_chunks(batch), timeout=30)
    assert delta(v.stats(), moved, "worker", "chunks_loaded") == 0
    return before, verify_counts(daemon)


def test_verifying_engine_over_damaged_chunks_serves_plain_prefill_and_drops_them(pool, kv_daemon):
    batch = prompts(2, 900, seed=41)          # three full chunks a prompt
    before, after = save_then_verify(pool, kv_daemon, batch, damaged_chunk=1)
    assert after["checks"] - before["checks"] == full_chunks(batch)
    assert after["mismatches"] - before["mismatches"] == len(batch)
    assert after["max_difference"] > 1e-3
    keys = verifier(pool).chunk_keys(batch)
    with verifier(pool).chunk_client(kv_daemon) as c:
        assert [c.lookup(chain) for chain in keys] == [1, 1]   # no damaged chain is left, chunk 0 is intact
    assert stored(kv_daemon) == len(batch)


def test_verifying_engine_over_clean_chunks_counts_checks_and_no_mismatch(pool, kv_daemon):
    batch = prompts(2, 900, seed=42)
    before, after = save_then_verify(pool, kv_daemon, batch, damaged_chunk=None)
    assert after["checks"] - before["checks"] == full_chunks(batch)
    assert after["mismatches"] - before["mismatches"] == 0
    assert after["max_difference"] == 0.0       # float32 on the CPU: the same bits
    assert stored(kv_daemon) == full_chunks(batch)
