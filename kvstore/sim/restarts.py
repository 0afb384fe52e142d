"""Rolling restarts of a fleet in the simulator: what an upgrade costs in token hit rate, with and without a
restart that keeps the DRAM tier (``kvstore simulate --restart-every``).

A fleet of ``fleet`` simulated daemons (``replay.SimulatedStore``, each with the given tier sizes) serves the
trace; a request goes to the daemon its first two blocks hash to (a router's prefix affinity: a conversation's
requests share them). Every ``every`` requests the next daemon in turn restarts, until each has restarted once
(a rolling upgrade; with one daemon, it restarts every ``every`` requests). The same trace is replayed three
ways:

- ``none``: no restart (the reference);
- ``cold``: a restart loses the DRAM tier (``--no-adopt``, or a daemon without warm restart): every chunk leaves
  DRAM as at a clean stop, those the disk tier holds stay there (a clean stop flushes the write-back queue);
- ``warm``: a restart keeps the DRAM tier (``store/adoption.py``): the store goes on as it was. The seconds a
  restart takes to verify what it kept, during which its chunks are misses, are not modelled: on the real
  daemon they are the start itself plus a hash of every kept byte (``bench/warm_restart.py``), short next to the
  time between two requests' worth of trace at any real request rate.

The cost of an upgrade is the hit rate lost against ``none``, over the whole trace and over the requests from
the first restart to ``every`` requests past the last (the window the upgrade affects).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import ConfigError
from ..store.policies import DEFAULT_POLICY
from .replay import Capacity, SimulatedStore, block_key, hit_tokens_by_tier
from .trace import BLOCK_TOKENS, Request

MODES = ("none", "cold", "warm")


@dataclass(frozen=True)
class RollingPlan:
    """``fleet`` daemons, the next one restarting every ``every`` requests from request ``every`` on."""

    fleet: int
    every: int

    def restart_at(self, index: int, requests: int) -> int | None:
        """The daemon that restarts before request ``index`` (None: none does)."""
        if index == 0 or index % self.every:
            return None
        turn = index // self.every - 1
        if self.fleet > 1 and turn >= self.fleet:
            return None   # every daemon has restarted once: the upgrade is over
        return turn % self.fleet

    def window(self, requests: int) -> tuple[int, int]:
        """The requests an upgrade affects: from the first restart to ``every`` past the last one."""
        restarts = self.fleet if self.fleet > 1 else max(0, (requests - 1) // self.every)
        return min(self.every, requests), min(requests, self.every * (restarts + 1))


@dataclass
class ModeResult:
    mode: str
    restarts: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0
    window_input_tokens: int = 0
    window_hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def window_hit_rate(self) -> float:
        return self.window_hit_tokens / self.window_input_tokens if self.window_input_tokens else 0.0


def check_plan(fleet: int, every: int, requests: int, gpu_bytes: int) -> RollingPlan:
    """The plan, or a ConfigError saying in one line what cannot be simulated."""
    if gpu_bytes:
        raise ConfigError("--restart-every: restarts are not modelled with a GPU tier; drop --gpu-mem")
    if every >= requests:
        raise ConfigError(f"--restart-every: {every} requests is not less than the {requests} replayed; "
                          f"lower it (or raise --limit)")
    return RollingPlan(fleet, every)


def route(request: Request, fleet: int) -> int:
    """The daemon of the fleet a request goes to: by its first two blocks (prefix affinity)."""
    return hash(tuple(request.hash_ids[:2])) % fleet


def cold_restart(sim: SimulatedStore) -> None:
    """What a restart without warm restart leaves: every chunk out of DRAM (kept where the disk tier holds it)."""
    store = sim.store
    for entry in list(store.lru):
        store.lru.remove(entry)
        store.drop_host_copy(entry)


def replay_rolling(requests: Sequence[Request], capacity: Capacity, plan: RollingPlan, mode: str,
                   policy: str = DEFAULT_POLICY, block_tokens: int = BLOCK_TOKENS) -> ModeResult:
    """Serve ``requests`` through the fleet, restarting per ``plan`` as ``mode`` says (see the module doc)."""
    fleet = [SimulatedStore(capacity, policy) for _ in range(plan.fleet)]
    result = ModeResult(mode)
    first, last = plan.window(len(requests))
    for index, request in enumerate(requests):
        turn = plan.restart_at(index, len(requests))
        if turn is not None and mode != "none":
            result.restarts += 1
            if mode == "cold":
                cold_restart(fleet[turn])
        sim = fleet[route(request, plan.fleet)]
        hit = sum(hit_tokens_by_tier(sim.serve([block_key(b) for b in request.hash_ids]), request.input_length,
                                     block_tokens).values())
        result.input_tokens += request.input_length
        result.hit_tokens += hit
        if first <= index < last:
            result.window_input_tokens += request.input_length
            result.window_hit_tokens += hit
    return result


def upgrade_cost(requests: Sequence[Request], capacity: Capacity, plan: RollingPlan, policy: str = DEFAULT_POLICY,
                 block_tokens: int = BLOCK_TOKENS) -> dict:
    """The three replays and what the upgrade cost each way, as one JSON-ready dict."""
    results = {m: replay_rolling(requests, capacity, plan, m, policy, block_tokens) for m in MODES}
    first, last = plan.window(len(requests))
    base = results["none"]
    out: dict = {"fleet": plan.fleet, "every": plan.every, "restarts": results["cold"].restarts,
                 "window": [first, last]}
    for mode, r in results.items():
        out[mode] = {"hit_rate": round(r.hit_rate, 5), "window_hit_rate": round(r.window_hit_rate, 5),
                     "cost": round(base.hit_rate - r.hit_rate, 5),
                     "window_cost": round(base.window_hit_rate - r.window_hit_rate, 5)}
    return out
