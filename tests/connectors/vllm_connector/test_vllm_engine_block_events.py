"""A real vLLM engine (the CPU build) saves through the connector; the daemon's KV cache events name the engine's
blocks (vLLM's block hashes at vLLM's block size, chained, with the prompt's token ids), not our chunk keys.
Every batch is decoded by vLLM's own classes (``events_consumer``)."""

from __future__ import annotations

import os
import socket

import pytest

from conftest import wait_for
from harness.engines.vllm_real import (
    CHUNK, full_chunks, prompts, stored,
)
from support.engines.vllm_fixtures import engine_venv, pool  # noqa: F401 - fixtures
from support.events_consumer import Consumer
from kvstore.protocol.kv_events import block_hash

pytestmark = pytest.mark.timeout(900)   # engine starts of minutes each on a small, shared CPU machine

ENGINE_BLOCK = 128   # the CPU engine's block size in these tests (two blocks a chunk)


def test_saved_chunks_are_published_as_vllm_blocks_with_their_token_ids(pool, start_daemon):
    pub = "ipc://" + os.path.join(pool.workdir, "ev.sock")
    replay = "ipc://" + os.path.join(pool.workdir, "evr.sock")
    daemon = start_daemon("--events-endpoint", pub, "--events-replay-endpoint", replay, workdir=pool.workdir)
    batch = prompts(2, 600, seed=41)
    engine = pool.get("a", connector=pool.connector())
    engine.generate(batch)
    assert wait_for(lambda: stored(daemon) == full_chunks(batch), timeout=60)
    consumer = Consumer(pub, replay, topic="", exact=True)   # the daemon-wide stream
    c = daemon.client(namespace="watch")
    own = None
    try:
        s = c.stats()["events"]
        consumer.pump(s["next_seq"] - 1, s["incarnation"])
        # the connector named its engine: the engine's own stream holds the same blocks, on llm-d's topic
        topics = [t for t in s["engine_topics"] if t.startswith(f"kv@{socket.gethostname()}@")]
        assert len(topics) == 1 and s["engine_topics"][topics[0]] == 0, s["engine_topics"]
        own = Consumer(pub, replay, topic=topics[0], exact=True)
        own.take_snapshot()
        assert own.blocks == consumer.blocks and own.ranks == {0}
        blocks_per_prompt = (600 // CHUNK) * (CHUNK // ENGINE_BLOCK)
        assert len(consumer.blocks) == len(batch) * blocks_per_prompt
        keys = {block_hash(k) for chain in engine.chunk_keys(batch) for k in chain}
        assert not keys & set(consumer.blocks)   # the engine's names, not our chunk keys
        by_parent = {parent: h for h, (parent, _, _) in consumer.blocks.items()}
        for prompt in batch:   # walk each chain from its root: the blocks' token ids are the prompt's
            roots = [h for h, (parent, tokens, _) in consumer.blocks.items()
                     if parent is None and tokens == prompt[:ENGINE_BLOCK]]
            assert len(roots) == 1
            h, tokens = roots[0], []
            while h is not None:
                _, ids, size = consumer.blocks[h]
                assert size == ENGINE_BLOCK and "CPU" in consumer.held[h]
                tokens += ids
                h = by_parent.get(h)
            assert tokens == prompt[:len(tokens)] and len(tokens) == blocks_per_prompt * ENGINE_BLOCK
    finally:
        consumer.close()
        if own is not None:
            own.close()
        c.close()
