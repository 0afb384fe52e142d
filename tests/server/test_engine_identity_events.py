"""Whose cache it is: an engine that names itself at hello gets the events of its namespace on its own topic
(``kv@{engine_id}@{model}``), with its data-parallel rank, starting with ``AllBlocksCleared`` and what the
namespace already holds; an engine that disconnects is not published for any more; raw clients' chunks stay on
the daemon-wide stream. Real daemons, every batch decoded by vLLM's own classes."""

from __future__ import annotations

import asyncio
import os
import time

import msgpack
import pytest
import zmq

from conftest import wait_for
from harness.daemons import short_tempdir
from support.events_consumer import Consumer, vllm_event_classes
from kvstore.errors import BadRequestError, LimitError
from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.protocol.engine_identity import EngineIdentity
from kvstore.protocol.kv_events import END_SEQ, SNAPSHOT_REQUEST

BLOCK = 4
CHUNK = 64 << 10


def start(start_daemon, *topic: str):
    workdir = short_tempdir()
    pub = "ipc://" + os.path.join(workdir, "ev.sock")
    replay = "ipc://" + os.path.join(workdir, "evr.sock")
    d = start_daemon("--events-endpoint", pub, "--events-replay-endpoint", replay, *topic, workdir=workdir)
    return d, pub, replay


def blocks(seed: int, chunks: int = 1) -> list[EngineBlocks]:
    out, parent = [], None
    for c in range(chunks):
        hashes = (seed * 100 + c + 1,)
        first = seed * 10 + c * BLOCK
        out.append(EngineBlocks(BLOCK, hashes, parent, tuple(range(first, first + BLOCK))))
        parent = hashes[-1]
    return out


def put(client, seed: int) -> set[int]:
    """Put one chunk named by the engine; returns its engine block hashes."""
    names = blocks(seed)
    client.put([os.urandom(16)], [os.urandom(CHUNK)], engine=names)
    return set(names[0].hashes)


def settle(consumers: list[Consumer], done, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            c.take_live(0.05)
        if done():
            return
        for c in consumers:   # a slow joiner misses what was sent before its subscription took: replay it
            c._replay()
    raise AssertionError("the events expected did not arrive")


def test_each_engine_gets_its_namespace_on_its_topic_with_its_rank(start_daemon):
    d, pub, replay = start(start_daemon)
    e1 = EngineIdentity("pod-a", "llama", 0)
    e2 = EngineIdentity("pod-b", "llama", 1)
    e3 = EngineIdentity("pod-c", "qwen", 0)
    subs = {name: Consumer(pub, replay, topic=topic, exact=True) for name, topic in
            (("e1", "kv@pod-a@llama"), ("e2", "kv@pod-b@llama"), ("e3", "kv@pod-c@qwen"), ("all", ""))}
    raw = d.client(namespace="shared")
    try:
        before = put(raw, 1)   # held before any engine connects: each engine's stream starts with it
        a1 = d.client(namespace="shared", identity=e1)
        a2 = d.client(namespace="shared", identity=e2)
        b3 = d.client(namespace="other", identity=e3)
        settle(list(subs.values()), lambda: before <= set(subs["e1"].held) and before <= set(subs["e2"].held)
               and subs["e3"].batches > 0 and before <= set(subs["all"].held))
        for name in ("e1", "e2", "e3"):
            assert subs[name].kinds[0] == "AllBlocksCleared"   # each engine's stream starts with its clear
        assert not subs["e3"].held   # another namespace's chunk is not the qwen engine's

        in_shared = put(a1, 2)
        in_other = put(b3, 3)
        settle(list(subs.values()), lambda: in_shared <= set(subs["e2"].held) and in_other <= set(subs["e3"].held)
               and (in_shared | in_other) <= set(subs["all"].held))
        assert set(subs["e1"].held) == set(subs["e2"].held) == before | in_shared
        assert set(subs["e3"].held) == in_other
        assert set(subs["all"].held) == before | in_shared | in_other
        assert subs["e1"].ranks == {0} and subs["e2"].ranks == {1} and subs["e3"].ranks == {0}
        assert subs["all"].ranks == {0}

        a2.close()   # pod-b goes away: it is not published for any more
        assert wait_for(lambda: "kv@pod-b@llama" not in raw.stats()["events"]["engine_topics"])
        gone = put(a1, 4)
        settle(list(subs.values()), lambda: gone <= set(subs["e1"].held))
        subs["e2"].take_live(0.5)
        assert not gone & set(subs["e2"].held)

        # A late engine in the namespace: cleared, then what the namespace holds, on its own topic
        late = Consumer(pub, replay, topic="kv@pod-d@llama", exact=True)
        try:
            d4 = d.client(namespace="shared", identity=EngineIdentity("pod-d", "llama", 2))
            settle([late], lambda: set(late.held) == before | in_shared | gone)
            assert late.kinds[0] == "AllBlocksCleared" and late.ranks == {2}
            # replay and snapshot per topic
            fresh = Consumer(pub, replay, topic="kv@pod-d@llama", exact=True)
            try:
                fresh._replay()
                assert set(fresh.held) == set(late.held) and fresh.ranks == {2}
                snap = Consumer(pub, replay, topic="kv@pod-d@llama", exact=True)
                try:
                    snap.take_snapshot()
                    assert set(snap.held) == set(late.held) and snap.ranks == {2}
                finally:
                    snap.close()
            finally:
                fresh.close()
            d4.close()
        finally:
            late.close()
        for c in (a1, b3):
            c.close()
    finally:
        raw.close()
        for s in subs.values():
            s.close()


def test_engines_of_one_rank_share_one_payload(start_daemon):
    d, pub, replay = start(start_daemon)
    subs = [Consumer(pub, replay, topic=t, exact=True) for t in ("kv@x@m", "kv@y@m", "")]
    a = d.client(namespace="ns", identity=EngineIdentity("x", "m"))
    b = d.client(namespace="ns", identity=EngineIdentity("y", "m"))
    try:
        stored = put(a, 5)
        settle(subs, lambda: all(stored <= set(s.held) for s in subs))
        last = [s.payloads[-1] for s in subs]
        assert last[0] == last[1] == last[2]   # packed once: the same bytes on every topic of rank 0
        assert msgpack.unpackb(last[0])[2] == 0
    finally:
        a.close()
        b.close()
        for s in subs:
            s.close()


def test_plain_topic_keeps_one_stream(start_daemon):
    d, pub, replay = start(start_daemon, "--events-topic", "kv@plain")
    sub = Consumer(pub, replay, topic="", exact=False)
    a = d.client(namespace="ns", identity=EngineIdentity("x", "m", 3))
    try:
        stored = put(a, 6)
        settle([sub], lambda: stored <= set(sub.held))
        assert sub.ranks == {0} and d.client(namespace="ns").stats()["events"]["topics"] == 1
    finally:
        a.close()
        sub.close()


@pytest.mark.parametrize("identity, error", [
    (EngineIdentity(""), BadRequestError),
    (EngineIdentity("pod a"), BadRequestError),
    (EngineIdentity("p", "m@x"), BadRequestError),
    (EngineIdentity("p", "m", -1), BadRequestError),
    (EngineIdentity("p" * 129), LimitError),
])
def test_a_bad_identity_is_refused_in_one_line(start_daemon, identity, error):
    d, _, _ = start(start_daemon)
    with pytest.raises(error) as refused:
        d.client(namespace="ns", identity=identity)
    assert "identity" in str(refused.value) and "\n" not in str(refused.value)


def test_old_client_without_identity_still_works(start_daemon):
    d, _, _ = start(start_daemon)
    c = d.client(namespace="ns")
    try:
        c.put([os.urandom(16)], [os.urandom(CHUNK)])
        assert c.stats()["events"]["engines"] == 0
    finally:
        c.close()


def test_replay_socket_answers_end_marker_for_an_unknown_topic(start_daemon):
    _, _, replay = start(start_daemon)
    ctx = zmq.Context()
    req = ctx.socket(zmq.DEALER)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(replay)
    try:
        req.send_multipart([b"", (0).to_bytes(8, "big"), b"kv@nobody@m"])
        assert req.poll(5000) and req.recv_multipart()[2] == END_SEQ
        req.send_multipart([b"", SNAPSHOT_REQUEST, b"kv@nobody@m"])   # no stream: the end marker alone
        assert req.poll(5000) and req.recv_multipart()[2] == END_SEQ
    finally:
        req.close(linger=0)
        ctx.term()


@pytest.mark.parametrize("fmt", ["map", "array"])
def test_a_batch_framed_around_events_packed_once_is_the_batch_packed_whole(fmt):
    from kvstore.protocol.kv_events import Cleared, Removed, Stored, batch_body, batch_bytes, encoded_events

    events = [Cleared(), Stored([1, 2], None, "CPU", 16, list(range(32))), Removed([1], "CPU")]
    packer = msgpack.Packer()
    packed = packer.pack(encoded_events(events, fmt, "f" * 16))
    for ts, rank in ((0.0, 0), (1.5e9, 7), (1.25, 65535)):
        assert batch_bytes(packer, ts, packed, rank) == msgpack.packb(batch_body(ts, events, fmt, "f" * 16, rank))


def test_a_topic_template_is_checked():
    from kvstore.errors import ConfigError
    from kvstore.protocol.event_topics import TopicTemplate

    assert TopicTemplate.parse("kv@{engine_id}@{model}").render(EngineIdentity("p", "m", 3)) == b"kv@p@m"
    assert TopicTemplate.parse("r{dp_rank}").render(EngineIdentity("p", "m", 3)) == b"r3"
    assert TopicTemplate.parse("kv@{tenant}@{engine_id}").render(EngineIdentity("p", "m", 3), "chat") == b"kv@chat@p"
    assert TopicTemplate.parse("plain").plain == b"plain" and TopicTemplate.parse("a{model}").plain == b""
    for bad in ("kv@{pod}", "kv@{model!r}", "kv@{model:>4}", "kv@{", "kv@}"):
        with pytest.raises(ConfigError, match="--events-topic"):
            TopicTemplate.parse(bad)


def test_an_engines_topic_names_the_tenant_owning_its_namespace(start_daemon, tmp_path):
    config = tmp_path / "kvstore.toml"
    config.write_text('[tenants.chat]\nnamespaces = ["vllm:chat-"]\n')
    d, pub, replay = start(start_daemon, "--config", str(config), "--events-topic", "kv@{tenant}@{engine_id}")
    chat = Consumer(pub, replay, topic="kv@chat@pod-a", exact=True)
    shared = Consumer(pub, replay, topic="kv@default@pod-b", exact=True)
    a = d.client(namespace="vllm:chat-llama", identity=EngineIdentity("pod-a", "chat-llama", 0))
    b = d.client(namespace="vllm:other", identity=EngineIdentity("pod-b", "other", 0))
    try:
        mine, theirs = put(a, 1), put(b, 2)
        settle([chat, shared], lambda: mine <= set(chat.held) and theirs <= set(shared.held))
        assert not theirs & set(chat.held) and not mine & set(shared.held)
        assert chat.kinds[0] == "AllBlocksCleared" and shared.kinds[0] == "AllBlocksCleared"
    finally:
        for c in (a, b):
            c.close()
        chat.close()
        shared.close()


def _reaches(publisher, sub) -> bool:
    """Whether a probe the publisher sends now (no loop runs: at once, on the daemon-wide topic) reaches ``sub``."""
    from kvstore.protocol.kv_events import Stored

    publisher.submit([Stored([1 << 40], None, "CPU", 4, [])], "probe")
    return bool(sub.poll(50))


def test_one_turn_of_several_namespaces_packs_each_event_once_and_every_stream_decodes(tmp_path):
    import msgspec

    KVEventBatch = vllm_event_classes().KVEventBatch
    from kvstore.protocol.kv_events import Stored, array_header
    from kvstore.server.events.publisher import BATCH_INTERVAL_S, EventPublisher, EventSettings

    for count in (0, 15, 16, 65535, 65536):
        assert array_header(count) == msgpack.packb([0] * count)[:len(array_header(count))]
    endpoint = "ipc://" + str(tmp_path / "ev.sock")
    publisher = EventPublisher(EventSettings(endpoint))
    publisher.holdings = lambda namespaces: []
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    try:
        assert wait_for(lambda: _reaches(publisher, sub))   # the subscription reaches the publisher
        while sub.poll(0):   # the probes
            sub.recv_multipart()
        publisher.engine_joined("a", EngineIdentity("pa", "m", 1))
        publisher.engine_joined("b", EngineIdentity("pb", "m", 2))
        async def one_turn() -> None:   # on a loop, the turn's changes are sent together at its end
            publisher.submit([Stored([i], None, "CPU", 4, [0, 1, 2, 3]) for i in range(20)], "a")
            publisher.submit([Stored([100], None, "STORAGE", 4, [])], "b")
            while publisher.stats()["pending"]:   # the end of the turn sends them
                await asyncio.sleep(BATCH_INTERVAL_S)

        asyncio.run(one_turn())
        got: dict[bytes, list] = {}
        decode = msgspec.msgpack.Decoder(type=KVEventBatch)
        while sub.poll(1000):
            topic, _, payload = sub.recv_multipart()
            got.setdefault(topic, []).append(decode.decode(payload))
        last = {topic: batches[-1] for topic, batches in got.items()}
        assert len(last[b""].events) == 21 and last[b""].data_parallel_rank == 0
        assert [e.block_hashes for e in last[b"kv@pa@m"].events] == [[i] for i in range(20)]
        assert last[b"kv@pa@m"].data_parallel_rank == 1
        assert [e.block_hashes for e in last[b"kv@pb@m"].events] == [[100]]
        assert last[b"kv@pb@m"].data_parallel_rank == 2
    finally:
        sub.close(linger=0)
        ctx.term()
        publisher.close()


def test_cli_replays_and_snapshots_one_engine_s_stream(start_daemon):
    import json

    from harness.daemons import run_cli

    d, pub, replay = start(start_daemon)
    a = d.client(namespace="ns", identity=EngineIdentity("pod-a", "llama", 1))
    try:
        stored = put(a, 8)
        assert wait_for_events(a, 2)
        for how in (("--from", "0"), ("--snapshot",)):
            out = run_cli("events", "--endpoint", pub, "--replay-endpoint", replay, "--topic", "kv@pod-a@llama",
                          *how, "--json", "--count", "2", timeout=30)
            assert out.returncode == 0, out.stderr
            lines = [json.loads(line) for line in out.stdout.splitlines()]
            assert [e["type"] for e in lines] == ["AllBlocksCleared", "BlockStored"], lines
            assert {e["topic"] for e in lines} == {"kv@pod-a@llama"} and set(lines[1]["block_hashes"]) == stored
    finally:
        a.close()


def wait_for_events(client, batches: int) -> bool:
    from conftest import wait_for

    return wait_for(lambda: client.stats()["events"]["batches"] >= batches, timeout=10)
