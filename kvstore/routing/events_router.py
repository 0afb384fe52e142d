"""Routing by the KV cache events: send a request to the engine that holds the most valuable prefix of it.

Each engine is a stream of an ``EventsIndex`` (a daemon and the engine's topic there). For a request's engine
block hashes (vLLM's ``request.block_hashes``, in order), an engine's score is the sum, over the longest prefix
of blocks it holds, of each block's weight in the cheapest medium holding it::

    weight(medium) = prefill_ns_per_block / (prefill_ns_per_block + load_ns_per_kib(medium) × KiB per block)

so a block in HBM (load cost 0) is worth a whole block of prefill saved, one on disk less the slower the disk
reads. ``load_ns_per_kib`` is what the engine's daemon measures and publishes in its stats (``load_ns_per_kib``:
the disk tier's promotion reads, ``STORAGE``), else the router's configured cost for that medium (``LoadCosts``).

The request goes to the best-scoring engine under its load bound (consistent hashing with bounded loads, as
``Router``); ties, and requests no engine holds any of, go by the ring walk of the first block no candidate
holds (the first block when none holds any), as ``Router`` does with chunk keys. With ``min_match``, a request
the best engine holds too little of is a new conversation: those are dealt in turn (``_newcomer_engine``),
counting the ones the ring placed, so that each engine's daemon keeps an even share of the conversations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ..errors import KVStoreError, UsageError
from .events_index import EventsIndex
from .hashring import LOAD_FACTOR, BoundedHashRing

MEDIA_COSTS = {"GPU": 0.0, "CPU": 0.0, "STORAGE": 0.0}   # ns per KiB when neither daemon nor caller says


@dataclass(frozen=True)
class EngineRef:
    """Where an engine's blocks are announced: the daemon (its ``EventSource.name``) and the engine's topic."""

    source: str
    topic: str


@dataclass(frozen=True)
class LoadCosts:
    """What a block is worth in each medium.

    Attributes:
        bytes_per_block: KV cache bytes of one engine block (all layers, K and V).
        prefill_ns_per_block: what computing one block again costs the engine, in nanoseconds.
        ns_per_kib: the load cost per KiB of each medium where the daemon publishes none.
    """

    bytes_per_block: int
    prefill_ns_per_block: float
    ns_per_kib: Mapping[str, float] = field(default_factory=lambda: dict(MEDIA_COSTS))

    def __post_init__(self) -> None:
        if self.bytes_per_block <= 0 or self.prefill_ns_per_block <= 0:
            raise UsageError(f"bytes_per_block and prefill_ns_per_block must be positive, got "
                             f"{self.bytes_per_block} and {self.prefill_ns_per_block}")

    def weight(self, medium: str, measured: Mapping[str, float]) -> float:
        """A block's worth in ``medium`` (0-1): the share of its prefill a load from there saves."""
        ns_per_kib = measured.get(medium, self.ns_per_kib.get(medium, 0.0))
        load = max(0.0, ns_per_kib) * self.bytes_per_block / 1024
        return self.prefill_ns_per_block / (self.prefill_ns_per_block + load)


class DaemonCosts:
    """Each daemon's published ``load_ns_per_kib``, asked of it at most every ``refresh_s`` seconds.

    Args:
        addresses: daemon name (as in the index's sources) -> the daemon's client address.
        refresh_s: how long an answer is kept.
    """

    def __init__(self, addresses: Mapping[str, str], refresh_s: float = 10.0) -> None:
        self.addresses = dict(addresses)
        self.refresh_s = refresh_s
        self._known: dict[str, tuple[float, dict[str, float]]] = {}

    def __call__(self, source: str) -> Mapping[str, float]:
        """``source``'s costs per medium (empty when it is unknown or does not answer)."""
        at, costs = self._known.get(source, (float("-inf"), {}))
        if time.monotonic() - at < self.refresh_s or source not in self.addresses:
            return costs
        costs = self._ask(self.addresses[source])
        self._known[source] = (time.monotonic(), costs)
        return costs

    @staticmethod
    def _ask(address: str) -> dict[str, float]:
        from ..client.client import Client

        try:
            with Client(address, timeout=1.0, use_arena=False) as client:
                published = client.stats().get("load_ns_per_kib") or {}
        except KVStoreError:
            return {}
        return {str(m): float(v) for m, v in published.items()}


@dataclass(frozen=True)
class EventsDecision:
    instance: str
    reason: str                 # "prefix" (the best-scoring engine), "hash" (no engine holds any of it) or
    #                             "balance" (the best holds less than min_match of it: a new conversation)
    blocks: int                 # leading blocks the chosen engine holds
    score: float                # their summed worth
    scores: dict[str, float] = field(default_factory=dict)


class EventsRouter:
    """Chooses an engine per request from what the events say each holds.

    Args:
        engines: engine name -> where its blocks are announced.
        index: the events index following those daemons.
        costs: what a block is worth per medium.
        measured: a daemon's published load costs per medium (``DaemonCosts``); None: the configured ones only.
        load_factor: the ring's bound on requests in flight per engine.
        min_match: the share of a request's blocks (0-1) the best engine must hold for its prefix to decide;
            below it the request is a new conversation, dealt in turn among the engines under the load bound
            (0: any held block decides). A prefix every new conversation shares (a system prompt) then does not
            pull them all to the engine that cached it first.
    Raises:
        UsageError: no engine, an engine on a daemon the index does not follow, or ``min_match`` outside 0-1.
    """

    def __init__(self, engines: Mapping[str, EngineRef], index: EventsIndex, costs: LoadCosts,
                 measured: Callable[[str], Mapping[str, float]] | None = None,
                 load_factor: float = LOAD_FACTOR, min_match: float = 0.0) -> None:
        if not engines:
            raise UsageError("an events router needs at least one engine")
        if not 0.0 <= min_match <= 1.0:
            raise UsageError(f"min_match is a share of a request's blocks, between 0 and 1; got {min_match}")
        self.min_match = min_match
        for name, ref in engines.items():
            if ref.source not in index.sources:
                raise UsageError(f"engine {name!r}: the index follows no daemon named {ref.source!r}")
        self.engines = dict(engines)
        self.index = index
        self.costs = costs
        self.measured = measured or (lambda source: {})
        self.ring = BoundedHashRing(list(engines), load_factor)
        self._dealt = {name: 0 for name in engines}   # new conversations sent to each (not routed by a prefix)
        for ref in self.engines.values():   # what each engine holds already, before its next change is published
            index.watch(ref.source, ref.topic)

    def score(self, name: str, hashes: Sequence[int]) -> tuple[int, float]:
        """(leading blocks of ``hashes`` engine ``name`` holds, their summed worth)."""
        ref = self.engines[name]
        prefix = self.index.held_prefix(ref.source, ref.topic.encode(), hashes)
        measured = self.measured(ref.source) if prefix else {}
        worth = sum(max(self.costs.weight(m, measured) for m in media) for media in prefix)
        return len(prefix), worth

    def route(self, hashes: Sequence[int]) -> EventsDecision:
        """Choose the engine for a request (its engine block hashes, in order) and count it as in flight there.
        Applies the events that arrived first."""
        self.index.pump()
        ring, bound = self.ring, self.ring.bound()
        scored = {name: self.score(name, hashes) for name in ring.names}
        eligible = [n for n in ring.names if ring.loads[n] < bound]
        best = max(scored[n][1] for n in eligible)
        longest = max(scored[n][0] for n in eligible if scored[n][1] == best)
        split = hashes[min(longest, len(hashes) - 1)].to_bytes(8, "big") if hashes else b""
        if best > 0 and longest < self.min_match * len(hashes):   # too little held to decide: balance instead
            chosen = self._newcomer_engine(eligible, split)
            reason = "balance"
        else:
            chosen = next(n for n in ring.order(split) if ring.loads[n] < bound and scored[n][1] == best)
            reason = "prefix" if best > 0 else "hash"
        if reason != "prefix":   # a new conversation: the balance deals the next ones around it
            self._dealt[chosen] += 1
        blocks, worth = scored[chosen]
        ring.start(chosen)
        return EventsDecision(chosen, reason, blocks, worth, {n: s for n, (_, s) in scored.items()})

    def _newcomer_engine(self, eligible: list[str], split: bytes) -> str:
        """Where a request too little of which is held goes (a new conversation): dealt in turn among the engines
        under the load bound, to the one given the fewest new conversations so far (then the least loaded; a
        ring walk from ``split`` breaks the last ties), so that each engine's daemon keeps an even share of the
        conversations and their follow-ups find room there."""
        loads, dealt = self.ring.loads, self._dealt
        least = min((dealt[n], loads[n]) for n in eligible)
        return next(n for n in self.ring.order(split) if n in eligible and (dealt[n], loads[n]) == least)

    def finish(self, instance: str) -> None:
        """The request sent to ``instance`` has ended."""
        self.ring.finish(instance)
