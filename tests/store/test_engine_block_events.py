"""A chunk put with the engine's block hashes is published as the engine's blocks (hashes, parent, token ids,
block size), in every tier it enters and leaves, live and in the snapshot; a chunk without them keeps its
chunk-key event; bad engine metadata is refused with one line. Decoded by vLLM's own classes."""

from __future__ import annotations

import os
import signal

import pytest

from conftest import wait_for
from harness.daemons import short_tempdir
from support.events_consumer import Consumer
from kvstore.errors import BadRequestError
from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.protocol.kv_events import block_hash

BLOCK = 4          # engine tokens per block
PER_CHUNK = 2      # engine blocks per chunk
CHUNK = 4 << 20    # 16 chunks fill the test host tier


def start(start_daemon):
    workdir = short_tempdir()
    pub = "ipc://" + os.path.join(workdir, "ev.sock")
    replay = "ipc://" + os.path.join(workdir, "evr.sock")
    d = start_daemon("--events-endpoint", pub, "--events-replay-endpoint", replay, "--events-topic", "kv@test",
                     workdir=workdir)
    return d, pub, replay


def engine_chain(chunks: int, seed: int, parent: int | None = None) -> list[EngineBlocks]:
    """The engine's names of ``chunks`` chained chunks: PER_CHUNK blocks of BLOCK tokens each."""
    out = []
    for c in range(chunks):
        hashes = tuple((seed << 32) + c * PER_CHUNK + b + 1 for b in range(PER_CHUNK))
        tokens = tuple(range(seed * 1000 + c * PER_CHUNK * BLOCK, seed * 1000 + (c + 1) * PER_CHUNK * BLOCK))
        out.append(EngineBlocks(BLOCK, hashes, parent, tokens))
        parent = hashes[-1]
    return out


def pumped(consumer: Consumer, c) -> None:
    def quiet() -> bool:   # write-back caught up, every sum taken, every event handed off
        s = c.stats()
        disk = s.get("disk") or {}
        busy = ("write_queue_chunks", "writes_in_flight", "reads_in_flight")
        return (not any(disk.get(k) for k in busy) and not s["integrity"]["sums_pending"]
                and s["events"]["pending"] == 0)
    assert wait_for(quiet, timeout=30)
    s = c.stats()["events"]
    consumer.pump(s["next_seq"] - 1, s["incarnation"])


def test_engine_blocks_are_published_with_hashes_parent_and_token_ids(start_daemon):
    d, pub, replay = start(start_daemon)
    c = d.client(namespace="events")
    keys = [os.urandom(16) for _ in range(3)]
    engine = engine_chain(3, seed=7)
    plain = [os.urandom(16)]
    consumer = Consumer(pub, replay, topic="kv@")
    try:
        c.put(keys, [os.urandom(CHUNK) for _ in keys], engine=engine)
        c.put(plain, [os.urandom(CHUNK)])   # no engine names: published under its chunk key
        pumped(consumer, c)
        for e in engine:
            for i, h in enumerate(e.hashes):
                assert "CPU" in consumer.held[h]   # (and STORAGE once written back)
                parent, tokens, size = consumer.blocks[h]
                assert parent == (e.hashes[i - 1] if i else e.parent)
                assert tokens == list(e.token_ids[i * BLOCK:(i + 1) * BLOCK]) and size == BLOCK
        assert all(block_hash(k) not in consumer.held for k in keys)
        assert "CPU" in consumer.held[block_hash(plain[0])]
        assert len(consumer.held) == PER_CHUNK * len(keys) + 1

        fresh = Consumer(pub, replay, topic="kv@")   # a late joiner's snapshot names the same blocks
        try:
            fresh.take_snapshot()
            assert fresh.held == consumer.held and fresh.blocks == consumer.blocks
        finally:
            fresh.close()

        c.delete(keys[1:])                  # leaves its last copy: removed under the engine's hashes
        pumped(consumer, c)
        gone = [h for e in engine[1:] for h in e.hashes]
        assert not any(h in consumer.held for h in gone)
        assert all("CPU" in consumer.held[h] for h in engine[0].hashes)
    finally:
        consumer.close()
        c.close()


def test_engine_blocks_follow_the_chunk_to_disk_and_out_of_dram(start_daemon):
    d, pub, replay = start(start_daemon)
    c = d.client(namespace="events")
    consumer = Consumer(pub, replay, topic="kv@")
    try:
        keys, engine = [], []
        for n in range(6):   # past the host tier: the first chunks are demoted to disk, their DRAM copy evicted
            more = [os.urandom(16) for _ in range(4)]
            names = engine_chain(4, seed=n + 1)
            c.put(more, [os.urandom(CHUNK) for _ in more], engine=names)
            keys += more
            engine += names
        pumped(consumer, c)
        stats = c.stats()
        media = [consumer.held.get(e.hashes[0], set()) for e in engine]
        assert sum("CPU" in m for m in media) == stats["tiers"]["host"]["chunks"]
        assert sum("STORAGE" in m for m in media) == stats["tiers"].get("disk", {}).get("chunks", 0) > 0
        for e, m in zip(engine, media):   # every engine block of a chunk is where its chunk is
            assert all(consumer.held.get(h, set()) == m for h in e.hashes)
    finally:
        consumer.close()
        c.close()


@pytest.mark.parametrize("bad, words", [
    (EngineBlocks(BLOCK, (1,), None, (1, 2, 3)), "holds 3 ids for 1 blocks of 4 tokens"),
    (EngineBlocks(BLOCK, ("x",), None, (1, 2, 3, 4)), "block_hashes[0]: 'x' is not an integer"),  # type: ignore
    (EngineBlocks(0, (1,), None, ()), "block_size: 0 is not an integer in [1, 65536]"),
    (EngineBlocks(BLOCK, (1,), -1, (1, 2, 3, 4)), "parent_block_hash: -1 is not an unsigned 64-bit integer"),
])
def test_bad_engine_metadata_is_refused_in_one_line(daemon, bad, words):
    c = daemon.client(namespace="events")
    try:
        with pytest.raises(BadRequestError) as err:
            c.put([os.urandom(16)], [os.urandom(4096)], engine=[bad])
        message = str(err.value)
        assert words in message and "\n" not in message and "leave 'engine' out" in message
        assert c.stats()["chunks"] == 0   # nothing stored
    finally:
        c.close()


def test_engine_blocks_survive_a_restart_with_the_disk_tier(start_daemon):
    d, pub, replay = start(start_daemon)
    c = d.client(namespace="events")
    keys = [os.urandom(16) for _ in range(3)]
    engine = engine_chain(3, seed=9)
    consumer = Consumer(pub, replay, topic="kv@")
    try:
        c.put(keys, [os.urandom(CHUNK) for _ in keys], engine=engine)
        pumped(consumer, c)   # written back: on disk with their names
        assert all("STORAGE" in consumer.held[h] for e in engine for h in e.hashes)
    finally:
        consumer.close()
        c.close()
    d.stop(signal.SIGKILL)
    d.remove_leftovers()
    d.start()
    fresh = Consumer(pub, replay, topic="kv@")
    try:
        fresh.take_snapshot()   # what the restarted daemon re-announced from its disk tier
        for e in engine:
            for i, h in enumerate(e.hashes):
                assert fresh.held[h] == {"STORAGE"}
                assert fresh.blocks[h] == (e.hashes[i - 1] if i else e.parent,
                                           list(e.token_ids[i * BLOCK:(i + 1) * BLOCK]), BLOCK)
        assert not any(block_hash(k) in fresh.held for k in keys)
    finally:
        fresh.close()
