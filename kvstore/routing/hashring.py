"""Consistent hashing with bounded loads: where a request goes when no instance holds its prefix.

Each instance owns ``VNODES`` points on a 64-bit ring (xxh64 of its name and the point's number); a request's key
hashes to a position and the instance owning the next point clockwise takes it. Adding or removing an instance
moves only the keys next to its points, so the other instances keep their caches warm.

Plain consistent hashing lets a popular key overload its owner; with bounded loads (Mirrokni, Thorup and
Zadimoghaddam, 2018) an instance is skipped while its load is at its share, ``ceil(c × (total + 1) / n)`` with
load factor ``c`` (1.25: nobody takes more than 25 % above the mean), and the walk moves on clockwise. Some
instance is always under the bound (the loads sum to ``total``), so a request always finds a home, and a key
keeps going to the same instance while that instance is not overloaded.

Load is what the caller says it is: ``start`` counts a request against its instance and ``finish`` takes it off
(requests in flight); a caller that never finishes gets bounded shares of all requests routed so far.
Cost: O(log(n × VNODES)) to find the position, O(n × VNODES) at worst to walk past overloaded instances.
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

import xxhash

VNODES = 64
LOAD_FACTOR = 1.25


def _hash(data: bytes) -> int:
    return xxhash.xxh64_intdigest(data)


class BoundedHashRing:
    def __init__(self, names: Sequence[str], load_factor: float = LOAD_FACTOR, vnodes: int = VNODES) -> None:
        if not names:
            raise ValueError("a ring needs at least one instance")
        if len(set(names)) != len(names):
            raise ValueError(f"instance names must be distinct, got {list(names)}")
        if load_factor < 1:
            raise ValueError(f"load factor must be at least 1, got {load_factor}")
        self.names = list(names)
        self.load_factor = load_factor
        points = sorted((_hash(f"{name}#{i}".encode()), name) for name in names for i in range(vnodes))
        self._positions = [p for p, _ in points]
        self._owners = [n for _, n in points]
        self.loads: dict[str, int] = {name: 0 for name in names}
        self.total = 0

    def order(self, key: bytes) -> list[str]:
        """Every instance once, in the order a walk clockwise from ``key``'s position meets them."""
        start = bisect.bisect_right(self._positions, _hash(key))
        seen: dict[str, None] = {}
        owners = self._owners
        for i in range(len(owners)):
            seen.setdefault(owners[(start + i) % len(owners)])
            if len(seen) == len(self.names):
                break
        return list(seen)

    def bound(self) -> int:
        """The most requests one instance may hold now."""
        return math.ceil(self.load_factor * (self.total + 1) / len(self.names))

    def pick(self, key: bytes) -> str:
        """The first instance clockwise from ``key`` that is under the bound (does not count it: see start)."""
        bound = self.bound()
        return next(n for n in self.order(key) if self.loads[n] < bound)

    def start(self, name: str) -> None:
        self.loads[name] += 1
        self.total += 1

    def finish(self, name: str) -> None:
        if self.loads[name] <= 0:
            raise ValueError(f"instance {name!r} has no request in flight to finish")
        self.loads[name] -= 1
        self.total -= 1
