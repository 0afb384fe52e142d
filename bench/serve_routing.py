"""Routing by the daemons' KV cache events in front of two real engines, against round robin and prefix hashing.

    python -m bench.serve_routing [--quick] [--repeats N] [--concurrency N] [--out FILE]

Two `vllm serve` engines (the CPU build, `bench/serve_engine.py`), each with its OWN kvstore daemon (a host
each: ``--events-endpoint`` and ``--events-replay-endpoint`` on, the connector naming its engine ``e0`` / ``e1``
so the daemon publishes on ``kv@e0@bench`` / ``kv@e1@bench``), behind one proxy (`bench/serve_router.py`) that
routes by three policies at three URL prefixes: round robin, prefix hashing (bounded consistent hashing of the
first vLLM block) and events (`kvstore.routing.EventsRouter` fed by both daemons' events). A multi-turn
conversation trace (follow-ups resend their session's growing context; arrivals jittered) is replayed through
each policy by `vllm bench serve`, repeats interleaved, both engines' prefix caches and both daemons emptied
before each replay. Each engine's own KV cache (``--num-gpu-blocks-override``) holds about two of its longest
requests, less than its share of the trace, so what a follow-up finds is mostly in its engine's daemon.

Before measuring: the outputs-agree check of `bench/serve.py` (engine e1's full prefill against e0's load from
its daemon) and the hashes check: the proxy's vLLM block hashes of the check prompts must be the ones e0's daemon
published (every full chunk held, as the events say). Writes bench/results/serve-routing-latest.json
(``--quick``: a temporary file); `python -m bench.serve_report` prints its table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bench._common import BenchDaemon, start_daemon
from bench.serve import INSTALL_HINT, run
from bench.serve_engine import ProxyProcess, Server, http
from bench.serve_harness import (
    FULL, QUICK, Arm, Bench, Profile, agreement, check_prompts, connector_config, interleaved, median_of,
)
from bench.serve_scenarios import CPU_BLOCK, trace_file
from bench.serve_traces import Conversations, conversation_trace

POLICIES = {"round_robin": "rr", "prefix_hash": "hash", "events": "events"}
MIN_MATCH = 0.5   # the events router follows a held prefix only when it is half the prompt or more
MODEL_NAME = "bench"   # the served model name: the engines' topics are kv@<engine>@bench
# one 256-token system prompt, then 512 new tokens a turn: follow-ups share their own session's context; the
# eight sessions run side by side (every session sends a turn between two turns of any other), so a daemon that
# sees every session (round robin) must keep all of them to find a follow-up's context, one that sees half of
# them (affinity) half
FULL_TRACE = Conversations(sessions=8, turns=4, systems=1, system_blocks=1, turn_blocks=3, block_tokens=256,
                           output_tokens=8, session_gap_ms=300, turn_gap_ms=4000, jitter_ms=1300)
QUICK_TRACE = Conversations(sessions=4, turns=3, systems=1, system_blocks=1, turn_blocks=2, block_tokens=256,
                            output_tokens=4, session_gap_ms=300, turn_gap_ms=2000, jitter_ms=800)


def engine_blocks(c: Conversations, in_flight: int = 2) -> int:
    """An engine's KV cache: `in_flight` of the trace's longest requests (CPU blocks of 128 tokens)."""
    return in_flight * -(-(c.longest_prompt() + c.output_tokens) // CPU_BLOCK) + 1


def found_blocks(rows: list[dict], pick: Callable[[int, dict], int], engines: int = 2,
                 capacity: int | None = None) -> list[int]:
    """Per request of ``rows``, the leading blocks of its prompt that the daemon of the engine ``pick`` chooses
    holds, each daemon keeping what its engine was sent (``capacity`` blocks at most, least recently used first out;
    None: everything)."""
    held: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(engines)]
    found = []
    for i, row in enumerate(rows):
        ids, mine = row["hash_ids"], held[pick(i, row)]
        found.append(next((n for n, h in enumerate(ids) if h not in mine), len(ids)))
        for h in ids:
            mine[h] = None
            mine.move_to_end(h)
        while capacity is not None and len(mine) > capacity:
            mine.popitem(last=False)
    return found


def policy_picks(engines: int) -> dict[str, Callable[[int, dict], int]]:
    """The two placements the ceilings compare: round robin, and perfect session affinity (every turn of a session
    on one engine, sessions spread in turn)."""
    first: dict[int, int] = {}
    return {"round_robin": lambda i, row: i % engines,
            "session_affinity": lambda i, row: first.setdefault(row["session"], len(first) % engines)}


def affinity_ceiling(rows: list[dict], engines: int = 2, capacity: int | None = None) -> dict[str, float]:
    """What routing can win on ``rows`` at most, from the trace alone: the share of prompt blocks found in the
    chosen engine's daemon (the leading blocks it holds) under round robin and under perfect session affinity
    (``policy_picks``); their ratio. ``capacity``: blocks each daemon keeps (``found_blocks``)."""
    total = sum(len(row["hash_ids"]) for row in rows)
    share = {name: sum(found_blocks(rows, pick, engines, capacity)) / total if total else 0.0
             for name, pick in policy_picks(engines).items()}
    rr, sticky = share["round_robin"], share["session_affinity"]
    return {"round_robin": rr, "session_affinity": sticky, "ratio": sticky / rr if rr else 0.0}


def prefill_ceiling(rows: list[dict], block_tokens: int, engines: int = 2,
                    capacity: int | None = None) -> dict[str, float]:
    """The bound the trace itself puts on the TTFT p50 ratio when a request's TTFT follows the tokens it must
    prefill: the median over requests of the prompt tokens not found in the chosen engine's daemon, under
    perfect session affinity and under round robin, and their ratio. Fixed costs per request (the HTTP hop,
    scheduling, the first decode step) keep a measured ratio above it."""
    p50 = {name: statistics.median(row["input_length"] - n * block_tokens
                                   for row, n in zip(rows, found_blocks(rows, pick, engines, capacity)))
           for name, pick in policy_picks(engines).items()}
    rr, sticky = p50["round_robin"], p50["session_affinity"]
    return {"round_robin_p50_tokens": rr, "session_affinity_p50_tokens": sticky, "ratio": sticky / rr if rr else 0.0}


def daemon_mem(bench: Bench, c: Conversations, share: float) -> str:
    """A daemon's DRAM: `share` of the trace's working set (0: the profile's whole host_mem)."""
    if share <= 0:
        return bench.profile.host_mem
    need = c.unique_tokens() * bench.profile.kv_bytes_per_token() * share
    return f"{max(16, -(-int(need) // (1 << 20)))}MiB"


def events_daemon(bench: Bench, i: int, host_mem: str, dram_only: bool = False) -> tuple[BenchDaemon, str, str]:
    """Engine ``e<i>``'s daemon, publishing events; (the daemon, its events endpoint, its replay endpoint)."""
    pub = "ipc://" + os.path.join(bench.workdir, f"ev{i}.sock")
    replay = "ipc://" + os.path.join(bench.workdir, f"evr{i}.sock")
    # the disk tier is on as by default (each host then keeps the whole working set, DRAM the hot part of it)
    # unless ``dram_only``
    disk = ["--disk-size", "0"] if dram_only else []
    daemon = start_daemon("--host-mem", host_mem, *disk, "--events-endpoint", pub,
                          "--events-replay-endpoint", replay, tcp=False)
    return daemon, pub, replay


def engine_arm(i: int, daemon: BenchDaemon, chunk_tokens: int) -> Arm:
    """Engine ``e<i>`` with the connector to its own daemon, naming itself ``e<i>`` to it."""
    config = connector_config(daemon.ipc, chunk_tokens)
    config["kv_connector_extra_config"] |= {"engine_id": f"e{i}", "served_model_name": MODEL_NAME}
    return Arm(f"routed-e{i}", args=("--kv-transfer-config", json.dumps(config)))


class RouterProxy(ProxyProcess):
    """`serve_router.py` in the engine's virtualenv in front of the engines, following their daemons' events."""

    def __init__(self, bench: Bench, engines: list[Server], sockets: list[tuple[str, str]]) -> None:
        specs = [f"--engine=e{i}={s.url},{pub},{replay},kv@e{i}@{MODEL_NAME}"
                 for i, (s, (pub, replay)) in enumerate(zip(engines, sockets))]
        per_block = bench.profile.kv_bytes_per_token() * CPU_BLOCK
        super().__init__(bench.venv.python, "serve_router.py",
                         ["--block-tokens", str(CPU_BLOCK), "--bytes-per-block", str(per_block),
                          "--min-match", str(MIN_MATCH), *specs], bench.env, bench.workdir)

    def stats(self) -> dict[str, Any]:
        return http(self.url + "/stats", timeout=30)

    def probe(self, prompt: list[int]) -> dict[str, Any]:
        return http(self.url + "/probe", body={"prompt": prompt}, timeout=30)


def hashes_agree(bench: Bench, proxy: RouterProxy) -> dict[str, Any]:
    """The proxy's hashes of the check prompts (stored by e0 during the agreement check) against what e0's
    daemon published: every block of the prompts' full chunks must be held on e0's topic."""
    want = [len(p) // bench.profile.chunk_tokens * (bench.profile.chunk_tokens // CPU_BLOCK)
            for p in check_prompts(bench.profile)]
    got: list[int] = []
    for prompt, n in zip(check_prompts(bench.profile), want):
        deadline = time.monotonic() + 30
        held = 0
        while time.monotonic() < deadline:
            held = proxy.probe(prompt)["held"]["e0"]
            if held >= n:
                break
            time.sleep(0.5)
        got.append(held)
    return {"blocks_expected": want, "blocks_held_by_events": got, "agree": got == want}


def replay_all(bench: Bench, proxy: RouterProxy, engines: list[Server], daemons: list[BenchDaemon],
               trace: tuple[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Each policy's replays, interleaved, from empty engines and daemons."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in POLICIES}
    for order in interleaved(list(POLICIES), bench.profile.repeats):
        for name in order:
            for s in engines:
                s.reset_prefix_cache()
            for d in daemons:
                bench.clear_daemon(d)
            before = proxy.stats()[POLICIES[name]]
            run_ = bench.replay(f"{proxy.url}/{POLICIES[name]}", engines, trace[0], trace[1], True, daemons=daemons)
            after = proxy.stats()[POLICIES[name]]
            run_["routed_by_prefix"] = after["by_prefix"] - before["by_prefix"]
            run_["requests_per_engine"] = {e: n - before["requests"].get(e, 0) for e, n in after["requests"].items()}
            runs[name].append(run_)
    return runs


def routing(bench: Bench, c: Conversations, share: float, dram_only: bool = False) -> dict[str, Any]:
    """The scenario: two engines, a daemon each holding `share` of the trace's working set (a fleet whose
    working set outgrows one host's cache but not two: where a router decides how much is found), three
    routing policies through one proxy."""
    blocks = engine_blocks(c)
    rows = conversation_trace(c)
    trace = trace_file(bench, "routing", rows)
    host_mem = daemon_mem(bench, c, share)
    started = [events_daemon(bench, i, host_mem, dram_only) for i in range(2)]
    daemons = [d for d, _, _ in started]
    try:
        arms = [engine_arm(i, d, bench.profile.chunk_tokens) for i, d in enumerate(daemons)]
        failed = bench.start_all([(a, blocks, 0) for a in arms])
        if failed:
            raise RuntimeError(f"an engine did not start: {next(iter(failed.values()))}")
        engines = [bench.get(a, blocks) for a in arms]
        check = agreement(bench, engines[0], engines[1])
        proxy = RouterProxy(bench, engines, [(pub, replay) for _, pub, replay in started])
        try:
            hashes = hashes_agree(bench, proxy)
            if not hashes["agree"]:
                raise RuntimeError(f"the proxy's block hashes are not the engines': {hashes}")
            runs = replay_all(bench, proxy, engines, daemons, trace)
        finally:
            proxy.close()
    finally:
        bench.keep()
        for d in daemons:
            d.stop()
    return {**finish(runs, c, blocks, rows, check, hashes, share), "daemon_host_mem": host_mem, "daemon_share": share,
            "daemon_disk_tier": not dram_only,
            "events_min_match": MIN_MATCH}


def finish(runs: dict[str, list[dict[str, Any]]], c: Conversations, blocks: int, rows: list[dict],
           check: dict[str, Any], hashes: dict[str, Any], share: float) -> dict[str, Any]:
    """The scenario's record: runs, medians, the ratios of events to the others, and what they were run on."""
    median = {k: median_of(v) for k, v in runs.items()}
    capacity = int(c.unique_tokens() * share) // c.block_tokens   # blocks a daemon keeps

    def rel(key: str, other: str) -> float | None:
        x, y = median["events"].get(key), median[other].get(key)
        return x / y if x and y else None

    ratios = {f"{key}_events_vs_{other}": rel(key, other) for other in ("round_robin", "prefix_hash")
              for key in ("token_hit_rate", "daemon_hit_rate", "p50_ttft_ms", "p90_ttft_ms", "request_throughput")}
    return {"runs": runs, "median": median, "ratios": ratios,
            "goals": {"token_hit_rate_events_vs_round_robin": 1.8, "p50_ttft_ms_events_vs_round_robin": 0.6},
            "goal_directions": {"token_hit_rate_events_vs_round_robin": ">=",
                                "p50_ttft_ms_events_vs_round_robin": "<="},
            "agreement": check, "hashes": hashes, "engines": 2, "engine_blocks": blocks,
            "engine_kv_tokens": blocks * CPU_BLOCK, "working_set_tokens": c.unique_tokens(), "requests": len(rows),
            "block_hit_ceiling": affinity_ceiling(rows),
            "block_hit_ceiling_at_daemon_size": affinity_ceiling(rows, capacity=capacity),
            "prefill_p50_ceiling_at_daemon_size": prefill_ceiling(rows, c.block_tokens, capacity=capacity),
            "trace": {k: getattr(c, k) for k in ("sessions", "turns", "systems", "system_blocks", "turn_blocks",
                                                  "block_tokens", "output_tokens", "session_gap_ms", "turn_gap_ms",
                                                  "jitter_ms")},
            "hit_rates": "token_hit_rate: prompt tokens not prefilled (found in vLLM's own prefix cache or loaded "
                         "by the connector) over all prompt tokens, from vllm:prompt_tokens_by_source summed over "
                         "both engines; daemon_hit_rate: the daemons' hit tokens over their lookup tokens (both "
                         "daemons); block_hit_ceiling: the trace's own bound, daemons keeping everything; "
                         "block_hit_ceiling_at_daemon_size: the same with each daemon keeping daemon_share of the "
                         "working set, least recently used out; prefill_p50_ceiling_at_daemon_size: at that size, "
                         "the median prompt tokens a request must prefill under session affinity over round robin "
                         "(the TTFT p50 ratio's bound when TTFT follows prefilled tokens)"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model, few requests (smoke test)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats per policy (default 2)")
    parser.add_argument("--concurrency", type=int, default=None, help="requests in flight (client)")
    from harness.engines.venv import venv_dir

    parser.add_argument("--venv", default=str(venv_dir()),
                        help=f"the vLLM CPU engine's virtualenv (`{INSTALL_HINT}`)")
    parser.add_argument("--out", default=None, help="write the result here instead")
    parser.add_argument("--daemon-share", type=float, default=0.25,
                        help="each daemon's DRAM as a share of the trace's working set (0: the profile's host_mem)")
    parser.add_argument("--dram-only", action="store_true",
                        help="daemons without their disk tier (each host then keeps only --daemon-share)")
    args = parser.parse_args(argv)
    if not 0 <= args.daemon_share <= 4:
        parser.error(f"--daemon-share must be between 0 and 4, got {args.daemon_share}")
    for name in ("repeats", "concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be at least 1, got {value}")
    args.scenarios, args.lmcache_site, args.real_restart = ["routing"], "", False
    return args


def profile(args: argparse.Namespace) -> Profile:
    base = replace(QUICK if args.quick else FULL, repeats=2)
    return replace(base, **{k: getattr(args, k) for k in ("repeats", "concurrency") if getattr(args, k) is not None})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    c = QUICK_TRACE if args.quick else FULL_TRACE
    scenario = {"routing": lambda bench: routing(bench, c, args.daemon_share, args.dram_only)}
    return run(args, scenario, name="serve-routing", profile=profile(args))


if __name__ == "__main__":
    sys.exit(main())
