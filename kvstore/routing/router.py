"""Prefix-affinity routing: send a request to the instance that already holds the longest prefix of it.

Each engine instance has its own daemon, so a prefix is only reusable on the instance that computed it. The
router asks every instance how many leading chunks of the request it holds (``lookup``: at most a deadline
long; an instance that does not answer in time counts as holding nothing) and picks, among the instances under
their load bound, the one with the longest cached prefix. When no eligible instance holds any of it, the request
goes by consistent hashing with bounded loads (``hashring.py``) of its first chunk key, so requests that share a
first chunk meet on one instance until it has its share. Ties between instances holding the same prefix are
broken the same way, by the ring walk of the first chunk *none of them* holds: when every instance holds a
shared system prompt, hashing the first chunk would send every new conversation down the same walk (one
instance full, the next full, the last idle — seen on Mooncake's trace, whose requests all share their first
block); hashing the chunk after the shared part spreads them.

The bound applies to affinity too: an instance at its share is not chosen even if it holds the longest prefix
(the next-best one is), so a popular prefix cannot pile every request onto one instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from .hashring import LOAD_FACTOR, BoundedHashRing

Lookup = Callable[[Sequence[bytes]], Mapping[str, "int | None"]]


@dataclass(frozen=True)
class Decision:
    instance: str
    reason: str                                  # "prefix" (longest cached prefix) or "hash" (none cached)
    cached_chunks: int                           # leading chunks the chosen instance holds
    lookups: dict[str, int | None] = field(default_factory=dict)   # None: no answer within the deadline


class Router:
    """Chooses an instance per request; ``lookup`` maps a chain of chunk keys to each instance's cached count."""

    def __init__(self, names: Sequence[str], lookup: Lookup, load_factor: float = LOAD_FACTOR) -> None:
        self.ring = BoundedHashRing(names, load_factor)
        self.lookup = lookup

    def route(self, keys: Sequence[bytes]) -> Decision:
        """Choose the instance for a request (its chunk keys) and count it as in flight there."""
        counts = dict(self.lookup(keys)) if keys else {}
        ring, bound = self.ring, self.ring.bound()
        eligible = [n for n in ring.names if ring.loads[n] < bound]
        cached = max(counts.get(n) or 0 for n in eligible)
        # Equals are met in the ring order of the first chunk no instance holds (the first chunk when none holds
        # any): requests that agree up to that chunk go the same way, and different continuations of a prefix
        # every instance holds (a shared system prompt) spread over the fleet.
        split = keys[min(cached, len(keys) - 1)] if keys else b""
        best = next(n for n in ring.order(split) if ring.loads[n] < bound and (counts.get(n) or 0) == cached)
        decision = Decision(best, "prefix" if cached else "hash", cached, counts)
        self.ring.start(best)
        return decision

    def finish(self, instance: str) -> None:
        """The request sent to ``instance`` has ended (keeps the load bound on requests in flight)."""
        self.ring.finish(instance)
