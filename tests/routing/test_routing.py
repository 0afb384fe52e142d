"""Prefix-affinity routing: real daemons answer lookups; a down or stopped one is skipped within the deadline;
bounded loads hold on synthetic streams; the ``kvstore route`` command."""

from __future__ import annotations

import json
import math
import signal
import subprocess
from collections import Counter

import pytest

from kvstore.routing import BoundedHashRing, DaemonFleet, Router

from harness.daemons import run_cli

NS, CHUNK_TOKENS = "route-test", 4
DEADLINE = 0.05


def tokens(seed: int, chunks: int) -> list[int]:
    return [seed * 1000 + i for i in range(chunks * CHUNK_TOKENS)]


@pytest.fixture
def two_daemons(start_daemon):
    a = start_daemon("--host-mem", "8MiB", "--disk-size", "0")
    b = start_daemon("--host-mem", "8MiB", "--disk-size", "0")
    return {"a": a, "b": b}


def put_chain(daemon, token_ids: list[int]) -> None:
    with daemon.client(namespace=NS, chunk_tokens=CHUNK_TOKENS) as c:
        keys = c.chunk_keys(token_ids)
        c.put(keys, [b"k" * 4096] * len(keys))


def test_request_goes_to_the_daemon_holding_its_prefix(two_daemons):
    put_chain(two_daemons["b"], tokens(1, 3))
    put_chain(two_daemons["a"], tokens(2, 1))
    addresses = {name: d.address for name, d in two_daemons.items()}
    with DaemonFleet(addresses, NS, CHUNK_TOKENS, deadline=2.0) as fleet:
        router = Router(list(addresses), fleet.lookup)
        first = router.route(fleet.chunk_keys(tokens(1, 5)))
        assert (first.instance, first.reason, first.cached_chunks) == ("b", "prefix", 3)
        assert first.lookups == {"a": 0, "b": 3}
        second = router.route(fleet.chunk_keys(tokens(2, 4)))
        assert (second.instance, second.cached_chunks) == ("a", 1)
        unseen = router.route(fleet.chunk_keys(tokens(3, 2)))
        assert unseen.reason == "hash" and unseen.cached_chunks == 0


def test_down_and_stopped_daemons_count_as_nothing(two_daemons, tmp_path):
    put_chain(two_daemons["a"], tokens(1, 2))
    put_chain(two_daemons["b"], tokens(1, 3))
    addresses = {"a": two_daemons["a"].address, "b": two_daemons["b"].address,
                 "gone": f"ipc://{tmp_path}/nobody.sock"}
    b = two_daemons["b"].proc
    with DaemonFleet(addresses, NS, CHUNK_TOKENS, deadline=DEADLINE) as fleet:
        router = Router(list(addresses), fleet.lookup)
        keys = fleet.chunk_keys(tokens(1, 4))
        fleet.lookup(keys)   # connect to the live ones first
        assert router.route(keys).instance == "b"
        b.send_signal(signal.SIGSTOP)   # b holds the longest prefix but cannot answer
        try:
            decision = router.route(keys)   # bounded by the fleet's deadline (its clients' timeout too)
        finally:
            b.send_signal(signal.SIGCONT)
        assert decision.lookups["gone"] is None and decision.lookups["b"] is None
        assert (decision.instance, decision.cached_chunks) == ("a", 2)


def test_bounded_load_holds_when_one_instance_holds_every_prefix():
    names = ["a", "b", "c", "d"]
    router = Router(names, lambda keys: {"a": 5, "b": 0, "c": 0, "d": 0})
    chosen = Counter()
    for i in range(1000):
        decision = router.route([b"same first chunk", i.to_bytes(4, "little")])
        chosen[decision.instance] += 1
        assert max(router.ring.loads.values()) <= math.ceil(1.25 * router.ring.total / len(names))
    assert chosen["a"] == max(chosen.values()) and chosen["a"] <= 1.25 * 1000 / 4 + 1
    assert set(chosen) == set(names)


def test_bounded_load_holds_for_hashing_with_requests_in_flight():
    names = [f"i{k}" for k in range(5)]
    router = Router(names, lambda keys: {})
    in_flight = []
    for i in range(3000):
        key = b"hot" if i % 3 else i.to_bytes(8, "little")   # two thirds share one first chunk
        chosen = router.route([key]).instance
        # checked when it is chosen: the instance was under ceil(1.25 × (in flight + 1) / n)
        assert router.ring.loads[chosen] <= math.ceil(1.25 * router.ring.total / len(names))
        in_flight.append(chosen)
        if len(in_flight) > 40:
            router.finish(in_flight.pop(0))
    assert len({name for name in in_flight}) > 1


def test_ring_keeps_keys_in_place_when_an_instance_leaves():
    keys = [i.to_bytes(8, "little") for i in range(2000)]
    before = BoundedHashRing(["a", "b", "c", "d"])
    after = BoundedHashRing(["a", "b", "c"])
    moved = sum(1 for k in keys if before.order(k)[0] != "d" and before.order(k)[0] != after.order(k)[0])
    assert moved == 0
    assert 300 < sum(1 for k in keys if before.order(k)[0] == "d") < 700


def run_route(args: list[str], stdin: str) -> subprocess.CompletedProcess:
    return run_cli("route", *args, input=stdin, timeout=60)


def test_cli_prints_one_instance_a_line(two_daemons):
    put_chain(two_daemons["a"], tokens(1, 2))
    put_chain(two_daemons["b"], tokens(2, 2))
    args = ["--instance", f"a={two_daemons['a'].address}", "--instance", f"b={two_daemons['b'].address}",
            "--namespace", NS, "--chunk-tokens", str(CHUNK_TOKENS), "--deadline-ms", "2000"]
    stdin = json.dumps(tokens(2, 3)) + "\n" + json.dumps({"tokens": tokens(1, 2)}) + "\n\n"
    result = run_route(args, stdin)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["b", "a"]
    result = run_route(args + ["--json"], json.dumps(tokens(2, 3)) + "\n")
    row = json.loads(result.stdout)
    assert row == {"instance": "b", "reason": "prefix", "cached_chunks": 2, "lookups": {"a": 0, "b": 2}}


@pytest.mark.parametrize("args, stdin, message", [
    (["--instance", "a"], "[1]\n", "NAME=ipc://"),
    (["--instance", "a=http://x"], "[1]\n", "NAME=ipc://"),
    (["--instance", "a=ipc:///tmp/x.sock", "--instance", "a=ipc:///tmp/y.sock"], "[1]\n", "given twice"),
    (["--instance", "a=ipc:///tmp/kvs-none.sock"], "[1, 2]\n{oops\n", "stdin line 2"),
    (["--instance", "a=ipc:///tmp/kvs-none.sock"], '{"tokens": "12"}\n', "list of integer token ids"),
    (["--instance", "a=ipc:///tmp/kvs-none.sock", "--load-factor", "0.5"], "[1]\n", "--load-factor"),
])
def test_cli_refuses_bad_input(args, stdin, message):
    result = run_route(args, stdin)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_cli_routes_by_hash_when_no_daemon_answers():
    result = run_route(["--instance", "a=ipc:///tmp/kvs-none-a.sock", "--instance", "b=ipc:///tmp/kvs-none-b.sock",
                        "--chunk-tokens", "2"], "[1, 2, 3]\n[1, 2, 9]\n")
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.split()
    assert first == second   # same first chunk, both under the bound (ceil(1.25 * 2 / 2) = 2)


def test_conversations_after_a_shared_system_prompt_spread_over_the_fleet():
    names = ["a", "b", "c", "d"]
    router = Router(names, lambda keys: {n: 1 for n in names})   # every instance holds the shared first chunk
    chosen = Counter(router.route([b"system prompt", i.to_bytes(8, "little")]).instance for i in range(400))
    assert set(chosen) == set(names) and min(chosen.values()) > 400 * 0.15
    again = Router(names, lambda keys: {n: 1 for n in names})
    assert again.route([b"system prompt", (7).to_bytes(8, "little")]).instance == \
        Router(names, lambda keys: {n: 1 for n in names}).route([b"system prompt", (7).to_bytes(8, "little")]).instance
