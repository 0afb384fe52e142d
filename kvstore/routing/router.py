"""Prefix-affinity routing: send a request to the instance that already holds the longest prefix of it.

Each engine instance has its own daemon, so a prefix is only reusable on the instance that computed it. The
router asks every instance how many leading chunks of the request it holds (``lookup``: at most a deadline
long; an instance that does not answer in time counts as holding nothing) and picks, among the instances under
their load bound, the one with the longest cached prefix; ties go to the one met first on the consistent-hash
walk of the first chunk key, so equal candidates are chosen the same way every time. When no eligible instance
holds any of it, the request goes by consistent hashing with bounded loads (``hashring.py``) of its first chunk
key, so requests that share a first chunk (a system prompt) meet on one instance until it has its share.

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
        bound = self.ring.bound()
        eligible = [n for n in self.ring.order(keys[0] if keys else b"") if self.ring.loads[n] < bound]
        best = max(eligible, key=lambda n: counts.get(n) or 0)   # the first of equals: ring order
        cached = counts.get(best) or 0
        decision = Decision(best, "prefix" if cached else "hash", cached, counts)
        self.ring.start(best)
        return decision

    def finish(self, instance: str) -> None:
        """The request sent to ``instance`` has ended (keeps the load bound on requests in flight)."""
        self.ring.finish(instance)
