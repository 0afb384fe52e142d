"""The routing proxy of `bench/serve_routing.py` (`bench/serve_router.py`) without an engine: its three policies'
decisions over two real daemons publishing KV cache events, followed by a real events index; and its requests
forwarded to the replica chosen, through its HTTP app.

The proxy's own hasher is vLLM's (it needs the engine's virtualenv); here a chained hash of the same shape names the
blocks both where they are put and where they are routed. That the proxy's vLLM hashes are the engines' is checked
by the benchmark itself before it measures (`hashes_agree`: the check prompts' blocks must be held, as the events
say, on the engine that stored them)."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from bench.serve_router import Policies, Replica, make_app, parse_replica
from conftest import wait_for
from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.protocol.engine_identity import EngineIdentity
from kvstore.routing import LoadCosts
from harness.daemons import short_tempdir
from harness.servers import EXTRAS_COMMAND

BLOCK = 8          # tokens per engine block
CHUNK_BLOCKS = 2   # engine blocks per chunk
COSTS = LoadCosts(bytes_per_block=1 << 16, prefill_ns_per_block=1e6)


def hasher(tokens: list[int]) -> list[int]:
    """Chained 64-bit hashes of the full blocks of ``tokens`` (the shape of vLLM's)."""
    out, parent = [], b""
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        parent = hashlib.blake2b(parent + repr(tokens[start:start + BLOCK]).encode(), digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


def store(client, prompt: list[int]) -> None:
    """Put ``prompt``'s full chunks, named by their engine blocks, as the connector does."""
    hs = hasher(prompt)
    chunks = len(hs) // CHUNK_BLOCKS
    span = CHUNK_BLOCKS * BLOCK
    names = [EngineBlocks(BLOCK, tuple(hs[c * CHUNK_BLOCKS:(c + 1) * CHUNK_BLOCKS]),
                          hs[c * CHUNK_BLOCKS - 1] if c else None, tuple(prompt[c * span:(c + 1) * span]))
             for c in range(chunks)]
    client.put([os.urandom(16) for _ in names], [os.urandom(1 << 16) for _ in names], engine=names)


def replicas(start_daemon, urls: tuple[str, str] = ("http://127.0.0.1:1", "http://127.0.0.1:2")):
    out, daemons = [], []
    for i, url in enumerate(urls):
        workdir = short_tempdir()
        pub, replay = "ipc://" + os.path.join(workdir, "ev.sock"), "ipc://" + os.path.join(workdir, "evr.sock")
        daemons.append(start_daemon("--events-endpoint", pub, "--events-replay-endpoint", replay, workdir=workdir))
        out.append(Replica(f"e{i}", url, pub, replay, f"kv@e{i}@m"))
    return out, daemons


def test_events_send_a_follow_up_to_the_engine_whose_daemon_holds_it_round_robin_alternates(start_daemon):
    reps, daemons = replicas(start_daemon)
    clients = [d.client(namespace="ns", identity=EngineIdentity(f"e{i}", "m")) for i, d in enumerate(daemons)]
    first, other = list(range(3, 3 + 6 * BLOCK)), list(range(100, 100 + 6 * BLOCK))
    policies = Policies(reps, hasher, COSTS)
    try:
        store(clients[1], first)                 # e1 served the first turn of this conversation
        store(clients[0], other)
        assert wait_for(lambda: policies.probe(first)["held"] == {"e0": 0, "e1": 6}, timeout=10)
        follow_up = first + list(range(900, 900 + 2 * BLOCK))
        for _ in range(3):                       # every time, while e1 has room under the load bound
            assert policies.choose("events", follow_up) == "e1"
            policies.finish("events", "e1")
        assert policies.choose("events", other + [5] * BLOCK) == "e0"
        policies.finish("events", "e0")
        assert policies.stats["events"].as_dict() == {"requests": {"e1": 3, "e0": 1}, "by_prefix": 4,
                                                     "blocks_held": 3 * 6 + 6}
        assert [policies.choose("rr", follow_up) for _ in range(4)] == ["e0", "e1", "e0", "e1"]

        # prefix hashing: the first block decides, whoever holds the rest
        picked = policies.choose("hash", follow_up)
        policies.finish("hash", picked)
        assert policies.choose("hash", first[:BLOCK] + [7] * 3 * BLOCK) == picked
        policies.finish("hash", picked)

        # the load bound: a second request in flight on the holder may stay, a third goes elsewhere
        held = [policies.choose("events", follow_up) for _ in range(3)]
        assert held[:2] == ["e1", "e1"] and held[2] == "e0"
        for name in held:
            policies.finish("events", name)

        # nobody holds it (or the prompt is text): the ring decides, the same way each time
        assert policies.choose("events", "a text prompt") == policies.choose("events", "another text")
        with pytest.raises(ValueError, match="unknown policy 'random'; choose from rr, hash, events"):
            policies.choose("random", first)
    finally:
        policies.close()
        for c in clients:
            c.close()


def test_a_cleared_daemon_is_no_longer_routed_to(start_daemon):
    reps, daemons = replicas(start_daemon)
    client = daemons[1].client(namespace="ns", identity=EngineIdentity("e1", "m"))
    prompt = list(range(3, 3 + 4 * BLOCK))
    policies = Policies(reps, hasher, COSTS)
    try:
        store(client, prompt)
        assert wait_for(lambda: policies.probe(prompt)["held"]["e1"] == 4, timeout=10)
        client.clear()
        assert wait_for(lambda: policies.probe(prompt)["held"]["e1"] == 0, timeout=10)
        policies.choose("events", prompt)
        assert policies.stats["events"].by_prefix == 0
    finally:
        policies.close()
        client.close()


def test_replicas_are_named_with_all_four_parts():
    r = parse_replica("e0=http://127.0.0.1:8000,ipc:///tmp/ev,ipc:///tmp/evr,kv@e0@bench")
    assert r == Replica("e0", "http://127.0.0.1:8000", "ipc:///tmp/ev", "ipc:///tmp/evr", "kv@e0@bench")
    with pytest.raises(ValueError, match="expected NAME=URL,EVENTS_ENDPOINT,REPLAY_ENDPOINT,TOPIC"):
        parse_replica("e0=http://127.0.0.1:8000,ipc:///tmp/ev")


def test_the_app_forwards_each_request_to_the_chosen_replica_and_streams_its_reply(start_daemon):
    pytest.importorskip("aiohttp", reason=f"the proxy runs on aiohttp, which comes with the engines: {EXTRAS_COMMAND}")
    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    async def scenario() -> None:
        seen: list[tuple[str, str]] = []

        def backend(name: str) -> web.Application:
            async def reply(request: web.Request) -> web.StreamResponse:
                seen.append((name, request.path))
                out = web.StreamResponse()
                await out.prepare(request)
                for piece in (b"data: one\n\n", b"data: two\n\n"):
                    await out.write(piece)
                return out
            app = web.Application()
            app.router.add_post("/v1/completions", reply)
            return app

        servers = [TestServer(backend(f"e{i}")) for i in range(2)]
        for s in servers:
            await s.start_server()
        reps, _ = replicas(start_daemon, tuple(str(s.make_url("")).rstrip("/") for s in servers))
        policies = Policies(reps, hasher, COSTS)
        proxy = TestServer(make_app(policies))
        await proxy.start_server()
        try:
            async with ClientSession() as http:
                for _ in range(2):
                    async with http.post(proxy.make_url("/rr/v1/completions"), json={"prompt": [1, 2, 3]}) as r:
                        assert r.status == 200 and await r.read() == b"data: one\n\ndata: two\n\n"
                async with http.get(proxy.make_url("/hash/v1/completions")) as r:   # not routed, not counted
                    assert r.status == 405
                async with http.get(proxy.make_url("/stats")) as r:
                    assert (await r.json())["rr"]["requests"] == {"e0": 1, "e1": 1}
            assert seen == [("e0", "/v1/completions"), ("e1", "/v1/completions")]
            assert policies.stats["hash"].as_dict()["requests"] == {}
        finally:
            await proxy.close()
            for s in servers:
                await s.close()

    asyncio.run(scenario())
