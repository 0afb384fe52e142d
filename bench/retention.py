"""What retention classes cost a put, and what they keep: an in-process Store, one-chunk puts that each evict one.

    python -m bench.retention [--quick]

Cost. A full DRAM tier (a virtual arena, so only the index and the queues are measured) takes one-chunk puts, each
of which evicts one chunk, in three modes: ``plain`` (every put ``normal``: the single policy queue a daemon keeps
until a put asks for a class), ``classes`` (puts cycle through ``low``, ``normal``, ``high``: one queue per
class) and ``pins`` (as ``classes``, with one put in ten a ``pin`` within the bound). Each mode's time per put
is the median of interleaved repeats, for each eviction policy.

Keep. A hot set of chunks, read between floods of one-shot chunks larger than the tier, survives as ``high`` (the
flood ``normal``) or as ``low`` flood around ``normal`` hot chunks, and is lost when everything is ``normal``:
the hot set's hit rate after each flood, per mode.

Writes bench/results/retention-latest.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from bench._common import write_result

from kvstore.defaults import EVICTION_POLICIES
from kvstore.protocol.retention import parse_retention
from kvstore.store.store import PinSettings, Store
from kvstore.tiers.host.tier import HostTier
from kvstore.store.ledgers.builder import tier_ledgers
from kvstore.tiers.virtual import VirtualArena

CHUNK = 4096
TIER_CHUNKS = 4096
MODES = {"plain": ["normal"], "classes": ["low", "normal", "high"],
         "pins": ["low", "normal", "high", "normal", "low", "high", "normal", "low", "high", "pin"]}


def make_store(policy: str) -> Store:
    return Store(HostTier(VirtualArena(TIER_CHUNKS * CHUNK)), 1e9, 1e9, tier_ledgers(policy), clock=lambda: 0.0,
                 pins=PinSettings(60.0, 600.0, 0.1))


def put_us(policy: str, mode: str, puts: int) -> float:
    """Microseconds per one-chunk put into a full tier (each evicts one chunk), classes cycling as ``mode`` says."""
    store = make_store(policy)
    asks = itertools.cycle([parse_retention(name) for name in MODES[mode]])
    serial = itertools.count()

    def put() -> None:
        key = next(serial).to_bytes(16, "little")
        handle, _ = store.reserve(b"w", "ns", [key], [CHUNK], None, retention=next(asks))
        store.commit(b"w", handle.id)

    for _ in range(TIER_CHUNKS + 64):   # fill: from here every put evicts
        put()
    t0 = time.perf_counter()
    for _ in range(puts):
        put()
    return (time.perf_counter() - t0) / puts * 1e6


def hot_hit_rate(policy: str, hot_class: str, flood_class: str, rounds: int = 5) -> float:
    """The share of a hot set (a quarter of the tier) found after each flood of one-shot chunks (1.5 tiers)."""
    store = make_store(policy)
    hot = [i.to_bytes(16, "big") for i in range(TIER_CHUNKS // 4)]
    serial = itertools.count(1 << 40)
    found = []
    for _ in range(rounds):
        missing = [k for k in hot if k not in store.index]
        for key in missing:
            handle, _ = store.reserve(b"w", "ns", [key], [CHUNK], None, retention=parse_retention(hot_class))
            store.commit(b"w", handle.id)
        store.lookup(hot[:1])
        for _ in range(TIER_CHUNKS * 3 // 2):
            key = next(serial).to_bytes(16, "big")
            handle, _ = store.reserve(b"w", "ns", [key], [CHUNK], None, retention=parse_retention(flood_class))
            store.commit(b"w", handle.id)
        found.append(sum(k in store.index for k in hot) / len(hot))
    return statistics.mean(found)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats, puts = (3, 2000) if args.quick else (7, 20000)
    cost: dict[str, dict[str, float]] = {}
    for policy in EVICTION_POLICIES:
        samples: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(repeats):   # interleaved: each repeat runs every mode once
            for mode in MODES:
                samples[mode].append(put_us(policy, mode, puts))
        cost[policy] = {f"{mode}_us_per_put": round(statistics.median(v), 3) for mode, v in samples.items()}
        cost[policy]["classes_over_plain"] = round(cost[policy]["classes_us_per_put"]
                                                   / cost[policy]["plain_us_per_put"], 3)
    keep = {policy: {"all_normal": hot_hit_rate(policy, "normal", "normal"),
                     "hot_high": hot_hit_rate(policy, "high", "normal"),
                     "flood_low": hot_hit_rate(policy, "normal", "low")} for policy in EVICTION_POLICIES}
    path = write_result("retention", {"tier_chunks": TIER_CHUNKS, "puts": puts, "repeats": repeats,
                                      "cost": cost, "hot_set_hit_rate": keep}, quick=args.quick)
    print("| policy | plain µs/put | classes µs/put | pins µs/put | classes/plain | hot hit: all normal | hot high |"
          " flood low |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for policy in EVICTION_POLICIES:
        c, k = cost[policy], keep[policy]
        print(f"| {policy} | {c['plain_us_per_put']} | {c['classes_us_per_put']} | {c['pins_us_per_put']} | "
              f"{c['classes_over_plain']} | {k['all_normal']:.2f} | {k['hot_high']:.2f} | {k['flood_low']:.2f} |")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
