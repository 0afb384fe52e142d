"""kvstore's counters as vLLM's `KVConnectorStats`, so vLLM's own "KV Transfer metrics" log line shows them.

vLLM asks each worker's connector (after every step) and the scheduler's (after every update) for the stats
of the interval since it last asked, sums the workers' and the scheduler's with `aggregate`, ships them to its
logger as `to_dict()`, rebuilds them there with `KVStoreConnector.build_kv_connector_stats` and logs `reduce()`.
Every field is a sum over the interval, so aggregating is adding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

# Scheduler: prompt tokens offered from the store and allocated. Workers: the loads and saves done.
FIELDS: tuple[str, ...] = (
    "hit_tokens", "lookups", "loaded_chunks", "loaded_bytes", "load_failures", "saved_chunks", "saved_bytes",
    "saves_dropped", "save_failures", "load_seconds", "save_seconds", "unkeyable",
)


@dataclass
class KVStoreConnectorStats(KVConnectorStats):
    """One interval's kvstore counters (`data` maps each of `FIELDS` to a number)."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.data) - set(FIELDS))
        if unknown:
            raise ValueError(f"kvstore connector stats have no field {unknown[0]!r}; fields: {', '.join(FIELDS)}")
        self.data: dict[str, int | float] = {name: self.data.get(name, 0) for name in FIELDS}

    def reset(self) -> None:
        self.data = {name: 0 for name in FIELDS}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        """Add `other`'s counts (another worker's, or the scheduler's) to these."""
        for name, value in other.data.items():
            if name in self.data:
                self.data[name] += value
        return self

    def reduce(self) -> dict[str, int | float]:
        return {name: round(value, 3) if isinstance(value, float) else value for name, value in self.data.items()}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class Interval:
    """The growth of a set of cumulative counters since the last `take` (vLLM asks for an interval's stats)."""

    def __init__(self) -> None:
        self._last: dict[str, int | float] = {}

    def take(self, now: dict[str, Any]) -> dict[str, int | float]:
        grown = {name: value - self._last.get(name, 0) for name, value in now.items()}
        self._last = dict(now)
        return grown
