"""A routing HTTP proxy over engine replicas with three policies side by side, for the `routing` scenario.

    <engine venv>/bin/python bench/serve_router.py PORT --block-tokens 128 \\
        --engine e0=http://127.0.0.1:A,ipc:///…/ev0.sock,ipc:///…/evr0.sock,kv@e0@bench --engine e1=…

A POST to ``/<policy>/<path>`` goes to one replica's ``/<path>``, chosen by the policy, and its reply is
streamed back as it comes (so TTFT measured through the proxy is the replica's); any other method goes to the
first replica, neither routed nor counted:

* ``rr``: round robin;
* ``hash``: prefix hashing, consistent hashing with bounded loads (``kvstore.routing.BoundedHashRing``, load
  factor 1.25) of the vLLM block hash of the prompt's first ``--hash-blocks`` engine blocks;
* ``events``: ``kvstore.routing.EventsRouter``, fed by every replica's daemon's KV cache events: the replica
  whose daemon holds the longest prefix of the request's vLLM block hashes, under the same load bound.

A request's block hashes are vLLM's own (``vllm.v1.core.kv_cache_utils.hash_block_tokens`` chained over the
prompt's token ids, the hash function of ``--hash-algo``, ``NONE_HASH`` from ``init_none_hash``), reduced to the
integers the events carry: the proxy must run with the engines' ``PYTHONHASHSEED`` (the harness pins it for
every process), since ``NONE_HASH`` is derived from it. Prompts are token ids (``vllm bench serve``'s timed
traces send them); a text prompt is routed as if it held no block (ring walk of nothing).

``GET /health`` answers when the proxy is up, ``GET /stats`` gives each policy's decisions, and ``POST /probe``
with ``{"prompt": [ids]}`` gives, per replica, how many leading blocks of the prompt its daemon's events say it
holds (the check that the proxy's hashes are the engines'). Runs in the engine's virtualenv (vLLM for the
hashes, aiohttp with it) with the repository on ``PYTHONPATH`` (for ``kvstore.routing``).
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvstore.protocol.kv_events import block_hash
from kvstore.routing import BoundedHashRing, EngineRef, EventSource, EventsIndex, EventsRouter, LoadCosts

POLICIES = ("rr", "hash", "events")
Hasher = Callable[[Sequence[int]], list[int]]


@dataclass(frozen=True)
class Replica:
    """One engine behind the proxy: its URL, its daemon's event sockets and the engine's topic there."""

    name: str
    url: str
    endpoint: str
    replay_endpoint: str
    topic: str


def parse_replica(text: str) -> Replica:
    """``NAME=URL,EVENTS_ENDPOINT,REPLAY_ENDPOINT,TOPIC`` (one clear line naming what is missing otherwise)."""
    name, _, rest = text.partition("=")
    parts = rest.split(",")
    if not name or len(parts) != 4 or not all(parts):
        raise ValueError(f"--engine {text!r}: expected NAME=URL,EVENTS_ENDPOINT,REPLAY_ENDPOINT,TOPIC")
    return Replica(name, *parts)


def vllm_hasher(block_tokens: int, algo: str = "sha256") -> Hasher:
    """vLLM's block hashes of a prompt's full blocks, as the integers its KV cache events carry (the connector's
    reduction: the last 8 bytes, big-endian). Imports vLLM (the engine's virtualenv)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    fn = get_hash_fn_by_name(algo)
    kv_cache_utils.init_none_hash(fn)

    def hashes(tokens: Sequence[int]) -> list[int]:
        out, parent = [], None
        for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
            parent = kv_cache_utils.hash_block_tokens(fn, parent, tokens[start:start + block_tokens])
            out.append(block_hash(bytes(parent)))
        return out

    return hashes


@dataclass
class PolicyStats:
    """What one policy decided: requests per replica, and (events) how many went by a held prefix."""

    requests: Counter = field(default_factory=Counter)
    by_prefix: int = 0
    blocks_held: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"requests": dict(self.requests), "by_prefix": self.by_prefix, "blocks_held": self.blocks_held}


class Policies:
    """The three policies over the same replicas; ``choose`` then ``finish`` around each request.

    Args:
        replicas: the engines, in order.
        hasher: a prompt's engine block hashes (``vllm_hasher`` in the proxy).
        index: the events index following every replica's daemon (None: built from the replicas' endpoints).
        costs: what a block is worth per medium for the events router.
        hash_blocks: how many leading engine blocks the prefix hash covers.
        min_match: the events router's share of a prompt the best engine must hold to decide (``EventsRouter``).
    """

    def __init__(self, replicas: Sequence[Replica], hasher: Hasher, costs: LoadCosts,
                 index: EventsIndex | None = None, hash_blocks: int = 1, min_match: float = 0.0) -> None:
        if hash_blocks < 1:
            raise ValueError(f"hash_blocks must be at least 1, got {hash_blocks}")
        self.replicas = {r.name: r for r in replicas}
        self.hasher = hasher
        self.hash_blocks = hash_blocks
        self.index = index or EventsIndex([EventSource(r.name, r.endpoint, r.replay_endpoint) for r in replicas])
        self.events = EventsRouter({r.name: EngineRef(r.name, r.topic) for r in replicas}, self.index, costs,
                                   min_match=min_match)
        self.ring = BoundedHashRing(list(self.replicas))
        self.turn = itertools.cycle(list(self.replicas))
        self.stats = {p: PolicyStats() for p in POLICIES}

    def choose(self, policy: str, prompt: Any) -> str:
        """The replica for a request's prompt (token ids) under ``policy``, counted as in flight there."""
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
        hashes = self.hasher(prompt) if _token_ids(prompt) else []
        stats = self.stats[policy]
        if policy == "rr":
            name = next(self.turn)
        elif policy == "hash":
            key = hashes[min(self.hash_blocks, len(hashes)) - 1].to_bytes(8, "big") if hashes else b""
            name = self.ring.pick(key)
            self.ring.start(name)
        else:
            decision = self.events.route(hashes)
            name = decision.instance
            stats.by_prefix += decision.reason == "prefix"
            stats.blocks_held += decision.blocks
        stats.requests[name] += 1
        return name

    def finish(self, policy: str, name: str) -> None:
        """The request ``choose`` sent to ``name`` under ``policy`` has ended."""
        if policy == "hash":
            self.ring.finish(name)
        elif policy == "events":
            self.events.finish(name)

    def probe(self, prompt: Sequence[int]) -> dict[str, Any]:
        """Per replica, the leading blocks of ``prompt`` its daemon's events say it holds (after pumping)."""
        self.index.pump(0.2)
        hashes = self.hasher(prompt)
        return {"blocks": len(hashes), "held": {name: len(self.index.held_prefix(name, r.topic.encode(), hashes))
                                                for name, r in self.replicas.items()}}

    def close(self) -> None:
        self.index.close()


def _token_ids(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)


def make_app(policies: Policies) -> Any:
    """The aiohttp application: ``/health``, ``/stats``, ``/probe`` and ``/<policy>/<path>`` forwarded."""
    from aiohttp import ClientSession, ClientTimeout, web

    from bench.serve_proxy import relay

    app = web.Application(client_max_size=1 << 28)

    async def session(app: web.Application):
        app["session"] = ClientSession(timeout=ClientTimeout(total=None))
        yield
        await app["session"].close()
        policies.close()

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({p: s.as_dict() for p, s in policies.stats.items()})

    async def probe(request: web.Request) -> web.Response:
        return web.json_response(policies.probe((await request.json())["prompt"]))

    async def forward(request: web.Request) -> web.StreamResponse:
        policy, tail = request.match_info["policy"], request.match_info["tail"]
        body = await request.read()
        try:
            prompt = json.loads(body).get("prompt") if body else None
        except (json.JSONDecodeError, AttributeError):
            prompt = None
        routed = request.method == "POST"   # a GET (the client's /v1/models) is no request to route or count
        name = policies.choose(policy, prompt) if routed else next(iter(policies.replicas))
        try:
            url = f"{policies.replicas[name].url}/{tail}" + (f"?{request.query_string}" if request.query_string else "")
            return await relay(request, url, body)
        finally:
            if routed:
                policies.finish(policy, name)

    app.cleanup_ctx.append(session)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    app.router.add_post("/probe", probe)
    app.router.add_route("*", r"/{policy:(rr|hash|events)}/{tail:.*}", forward)
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--engine", action="append", required=True, type=parse_replica,
                        help="NAME=URL,EVENTS_ENDPOINT,REPLAY_ENDPOINT,TOPIC (one per replica)")
    parser.add_argument("--block-tokens", type=int, required=True, help="the engines' KV block size (tokens)")
    parser.add_argument("--hash-algo", default="sha256", help="the engines' --prefix-caching-hash-algo")
    parser.add_argument("--hash-blocks", type=int, default=1, help="leading engine blocks the prefix hash covers")
    parser.add_argument("--bytes-per-block", type=int, required=True, help="KV cache bytes of one engine block")
    parser.add_argument("--prefill-ns-per-block", type=float, default=1e8, help="what recomputing a block costs")
    parser.add_argument("--min-match", type=float, default=0.5,
                        help="share of a prompt the best engine must hold for the events router to follow it")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from aiohttp import web

    args = parse_args(argv)
    policies = Policies(args.engine, vllm_hasher(args.block_tokens, args.hash_algo),
                        LoadCosts(args.bytes_per_block, args.prefill_ns_per_block), hash_blocks=args.hash_blocks,
                        min_match=args.min_match)
    web.run_app(make_app(policies), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
