"""Routing by the KV cache events: an index fed by real daemons' events sends a request to the engine holding the
longest prefix of its engine block hashes, and to the hash ring when nobody holds any; it catches up on a gap by
replay, by a snapshot when replay cannot fill it, and starts over on a new incarnation; media are weighed by the
load cost each daemon measures or the router is given."""

from __future__ import annotations

import os

import msgpack
import pytest

from conftest import wait_for
from harness.daemons import short_tempdir
from kvstore.errors import UsageError
from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.protocol.engine_identity import EngineIdentity
from kvstore.protocol.kv_events import Cleared, Removed, Stored, batch_body
from kvstore.routing import (
    DaemonCosts, EngineRef, EventSource, EventsIndex, EventsRouter, LoadCosts,
)
from kvstore.routing.events_index import follow

BLOCK = 4
CHUNK = 64 << 10
COSTS = LoadCosts(bytes_per_block=1 << 20, prefill_ns_per_block=1e6)


def chain(seed: int, chunks: int) -> list[EngineBlocks]:
    """``chunks`` chunks of one engine block each, chained."""
    out, parent = [], None
    for c in range(chunks):
        h = seed * 1000 + c + 1
        out.append(EngineBlocks(BLOCK, (h,), parent, tuple(range(h * BLOCK, (h + 1) * BLOCK))))
        parent = h
    return out


def hashes(names: list[EngineBlocks]) -> list[int]:
    return [h for e in names for h in e.hashes]


def start(start_daemon, name: str):
    workdir = short_tempdir()
    pub = "ipc://" + os.path.join(workdir, "ev.sock")
    replay = "ipc://" + os.path.join(workdir, "evr.sock")
    d = start_daemon("--events-endpoint", pub, "--events-replay-endpoint", replay, workdir=workdir)
    return d, EventSource(name, pub, replay)


def test_the_engine_holding_the_longest_prefix_gets_the_request_else_the_ring(start_daemon):
    d1, s1 = start(start_daemon, "d1")
    d2, s2 = start(start_daemon, "d2")
    a = d1.client(namespace="ns", identity=EngineIdentity("pod-a", "m"))
    b = d2.client(namespace="ns", identity=EngineIdentity("pod-b", "m"))
    x, y = chain(1, 4), chain(2, 3)
    try:
        a.put([os.urandom(16) for _ in x], [os.urandom(CHUNK) for _ in x], engine=x)   # all of x on pod-a
        b.put([os.urandom(16)], [os.urandom(CHUNK)], engine=x[:1])                     # its first block on pod-b
        b.put([os.urandom(16) for _ in y], [os.urandom(CHUNK) for _ in y], engine=y)   # all of y on pod-b
        with EventsIndex([s1, s2]) as index:   # joins after the puts: it replays what it missed
            router = EventsRouter({"pod-a": EngineRef("d1", "kv@pod-a@m"), "pod-b": EngineRef("d2", "kv@pod-b@m")},
                                  index, COSTS, measured=DaemonCosts({"d1": d1.address, "d2": d2.address}))
            follow(index, 10, lambda: len(index.held_prefix("d2", b"kv@pod-b@m", hashes(y))) == 3
                   and len(index.held_prefix("d1", b"kv@pod-a@m", hashes(x))) == 4)
            first = router.route(hashes(x))
            assert (first.instance, first.reason, first.blocks) == ("pod-a", "prefix", 4)
            assert first.scores["pod-b"] == pytest.approx(1.0)   # one block, in DRAM (worth a whole block)
            router.finish(first.instance)
            second = router.route(hashes(y))
            assert (second.instance, second.reason, second.blocks) == ("pod-b", "prefix", 3)
            router.finish(second.instance)
            nobody = router.route([999_001, 999_002])
            assert nobody.reason == "hash" and nobody.blocks == 0 and nobody.instance in ("pod-a", "pod-b")
            assert router.route([999_001, 999_002]).instance == nobody.instance   # the same walk of the ring

            # live: pod-b gets the rest of x; the index follows
            b.put([os.urandom(16) for _ in x[1:]], [os.urandom(CHUNK) for _ in x[1:]], engine=x[1:])
            follow(index, 10, lambda: len(index.held_prefix("d2", b"kv@pod-b@m", hashes(x))) == 4)
            assert len(index.held_prefix("d2", b"kv@pod-b@m", hashes(x))) == 4
    finally:
        a.close()
        b.close()


class Daemon:
    """A synthetic publisher's replay socket: what an index asks, answered from its batches."""

    def __init__(self, keep_from: int = 0) -> None:
        self.batches: list[tuple[bytes, int, bytes]] = []
        self.keep_from = keep_from   # replay's buffer holds the batches from this seq on
        self.asked: list[list[bytes]] = []
        self.snapshot: bytes = b""

    def batch(self, topic: bytes, events: list, incarnation: str = "a" * 16, rank: int = 0) -> tuple[bytes, int, bytes]:
        seq = sum(1 for t, _, _ in self.batches if t == topic)
        out = (topic, seq, msgpack.packb(batch_body(1.0, events, "map", incarnation, rank)))
        self.batches.append(out)
        return out

    def ask(self, source: EventSource, frames: list[bytes]) -> list[tuple[bytes, int, bytes]]:
        self.asked.append(frames)
        if frames[0] == b"snapshot":
            last = max(s for t, s, _ in self.batches if t == frames[1])
            return [(frames[1], last, self.snapshot)]
        first = int.from_bytes(frames[0], "big")
        return [(t, s, p) for t, s, p in self.batches if t == frames[1] and s >= max(first, self.keep_from)]


def stored(*hs: int, medium: str = "CPU") -> Stored:
    return Stored(list(hs), None, medium, BLOCK)


def test_a_gap_is_replayed_a_lost_one_rebuilt_from_a_snapshot_and_a_restart_starts_over():
    daemon = Daemon()
    index = EventsIndex([EventSource("d", "ipc:///nonexistent/ev", "ipc:///nonexistent/evr")], ask=daemon.ask)
    t = b"kv@e@m"
    try:
        index.take("d", *daemon.batch(t, [Cleared()]))
        daemon.batch(t, [stored(1, 2)])                     # missed live
        index.take("d", *daemon.batch(t, [stored(3)]))      # the gap: replayed
        assert daemon.asked[-1] == [(1).to_bytes(8, "big"), t]
        assert [len(m) for m in index.held_prefix("d", t, [1, 2, 3])] == [1, 1, 1]

        daemon.keep_from = 10                               # replay's buffer lost them: a snapshot
        daemon.batch(t, [Removed([1], "CPU")])
        daemon.snapshot = msgpack.packb(batch_body(1.0, [Cleared(), stored(2, 3, 4)], "map", "a" * 16))
        index.take("d", *daemon.batch(t, [stored(4)]))
        assert daemon.asked[-1] == [b"snapshot", t]
        assert index.held_prefix("d", t, [1]) == [] and len(index.held_prefix("d", t, [2, 3, 4])) == 3
        assert index.streams[("d", t)].rebuilt == 1

        restarted = Daemon()                                # a new incarnation: its stream from its beginning
        index._ask = restarted.ask
        restarted.batch(t, [Cleared()], incarnation="b" * 16)
        index.take("d", *restarted.batch(t, [stored(7)], incarnation="b" * 16))
        assert index.held_prefix("d", t, [2]) == [] and index.held_prefix("d", t, [7]) == [{"CPU"}]
        assert index.streams[("d", t)].incarnation == "b" * 16
    finally:
        index.close()


def test_media_are_weighed_by_their_load_cost():
    daemon = Daemon()
    index = EventsIndex([EventSource("d", "ipc:///nonexistent/ev", "ipc:///nonexistent/evr")], ask=daemon.ask)
    try:
        index.take("d", *daemon.batch(b"kv@disk@m", [Cleared(), stored(1, 2, 3, medium="STORAGE")]))
        index.take("d", *daemon.batch(b"kv@dram@m", [Cleared(), stored(1, 2, medium="CPU")]))
        engines = {"disk": EngineRef("d", "kv@disk@m"), "dram": EngineRef("d", "kv@dram@m")}
        slow_disk = {"STORAGE": 4e6 / 1024}   # ns per KiB: a 1 MiB block loads in 4 ms, four times its prefill
        router = EventsRouter(engines, index, COSTS, measured=lambda source: slow_disk)
        decision = router.route([1, 2, 3])
        assert decision.instance == "dram" and decision.blocks == 2
        assert decision.scores["disk"] == pytest.approx(3 * 0.2)
        fast = EventsRouter(engines, index, COSTS)   # nothing measured, no configured cost: every medium is free
        assert fast.route([1, 2, 3]).instance == "disk"
        with pytest.raises(UsageError, match="no daemon named"):
            EventsRouter({"x": EngineRef("elsewhere", "t")}, index, COSTS)
    finally:
        index.close()


def test_a_prefix_below_min_match_does_not_decide_and_the_least_loaded_engine_gets_it():
    daemon = Daemon()
    index = EventsIndex([EventSource("d", "ipc:///nonexistent/ev", "ipc:///nonexistent/evr")], ask=daemon.ask)
    try:
        index.take("d", *daemon.batch(b"kv@a@m", [Cleared(), stored(1, 2, 3, 4)]))   # the system prompt, 1-2
        index.take("d", *daemon.batch(b"kv@b@m", [Cleared()]))
        engines = {"a": EngineRef("d", "kv@a@m"), "b": EngineRef("d", "kv@b@m")}
        router = EventsRouter(engines, index, COSTS, load_factor=4.0, min_match=0.5)
        follow_up = router.route([1, 2, 3, 4, 50])   # a holds 4 of 5: its prefix decides
        assert (follow_up.instance, follow_up.reason) == ("a", "prefix")
        new = router.route([1, 2, 60, 61, 62, 63])   # a holds 2 of 6: the least loaded engine, b
        assert (new.instance, new.reason) == ("b", "balance")
        eager = EventsRouter(engines, index, COSTS, load_factor=4.0)   # min_match 0: any held block decides
        assert eager.route([1, 2, 60, 61, 62, 63]).instance == "a"
        with pytest.raises(UsageError, match="min_match"):
            EventsRouter(engines, index, COSTS, min_match=1.5)
    finally:
        index.close()


def test_new_conversations_are_dealt_in_turn_counting_those_the_ring_placed():
    daemon = Daemon()
    index = EventsIndex([EventSource("d", "ipc:///nonexistent/ev", "ipc:///nonexistent/evr")], ask=daemon.ask)
    try:
        index.take("d", *daemon.batch(b"kv@a@m", [Cleared()]))
        index.take("d", *daemon.batch(b"kv@b@m", [Cleared()]))
        engines = {"a": EngineRef("d", "kv@a@m"), "b": EngineRef("d", "kv@b@m")}
        router = EventsRouter(engines, index, COSTS, load_factor=4.0, min_match=0.5)
        first = router.route([1, 2, 70, 71])   # nobody holds anything yet: the ring places it
        assert first.reason == "hash"
        router.finish(first.instance)
        index.take("d", *daemon.batch(b"kv@a@m", [stored(1, 2)]))   # the system prompt, now cached by both
        index.take("d", *daemon.batch(b"kv@b@m", [stored(1, 2)]))
        placed = []
        for n in range(4):   # each finished before the next: load never decides
            decision = router.route([1, 2, 100 + 4 * n, 101 + 4 * n, 102 + 4 * n, 103 + 4 * n])
            assert decision.reason == "balance"
            router.finish(decision.instance)
            placed.append(decision.instance)
        other = "b" if first.instance == "a" else "a"
        assert placed[0] == other   # the ring's placement counts: the other engine is dealt the next
        assert placed[1] != placed[2]   # then in turn, whichever the ring walk picks at a tie
        dealt = [first.instance, *placed]
        assert abs(dealt.count("a") - dealt.count("b")) == 1
    finally:
        index.close()


def test_a_daemon_publishes_its_measured_load_cost(start_daemon):
    d = start_daemon("--host-mem", "8MiB")
    c = d.client(namespace="ns")
    try:
        keys = [os.urandom(16) for _ in range(4)]
        for key in keys:   # more than DRAM holds: the first ones stay on disk only
            c.put([key], [os.urandom(3 << 20)])
            assert wait_for(lambda: not c.stats()["disk"]["write_queue_chunks"], timeout=30)
        with c.get(keys[:1]) as views:   # read back from disk
            assert len(views) == 1
        stats = c.stats()
        assert stats["load_ns_per_kib"].get("STORAGE", 0) == stats["disk"]["read_ns_per_kib"] > 0
    finally:
        c.close()
