"""The scenarios of `bench/serve.py`: each starts (or reuses) its engines, replays its trace on every arm with
interleaved repeats and returns the runs, their medians and the ratios its goals are stated in."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bench.serve_engine import ProxyProcess, Server, peer_broken
from bench.serve_harness import Arm, Bench, Profile, agreement, interleaved, median_of, ratio
from bench.serve_traces import (
    Conversations,
    compress_time,
    conversation_slice,
    conversation_trace,
    halves,
    read_rows,
    scaled_slice,
    unique_trace,
    working_set_tokens,
    write_jsonl,
)

KVSTORE = Arm("kvstore", connector=True)
VLLM = Arm("vllm")
CPU_BLOCK = 128   # the CPU build's KV block size (tokens); `engine_blocks` sizes caches in these
BIG = [(KVSTORE, None, 0), (KVSTORE, None, 1), (VLLM, None, 0), (VLLM, None, 1)]  # default-size engines


def trace_file(bench: Bench, name: str, rows: list[dict]) -> tuple[str, int]:
    return write_jsonl(rows, os.path.join(bench.workdir, f"trace-{name}.jsonl")), len(rows)


def pair(bench: Bench, blocks: int | None = None) -> tuple[Server, Server]:
    """The kvstore and vLLM-alone engines of this size (started once, in parallel, reused by later scenarios)."""
    bench.start_all([(KVSTORE, blocks, 0), (VLLM, blocks, 0)])
    return bench.get(KVSTORE, blocks), bench.get(VLLM, blocks)


def fresh(bench: Bench, server: Server, connector: bool) -> None:
    """Empty what a repeat must not inherit: vLLM's prefix cache and (for kvstore) the daemon."""
    server.reset_prefix_cache()
    if connector:
        bench.clear_daemon()


def compare(bench: Bench, arms: dict[str, tuple[list[Server], str]], trace: tuple[str, int],
            connector: set[str], concurrency: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """Replay `trace` on every arm (servers, the URL the client talks to), interleaved, from empty caches."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    for order in interleaved(list(arms), bench.profile.repeats):
        for name in order:
            servers, url = arms[name]
            for s in servers:
                fresh(bench, s, name in connector)
            runs[name].append(bench.replay(url, servers, trace[0], trace[1], name in connector, concurrency))
    return runs


def finish(runs: dict[str, list[dict[str, Any]]], **extra: Any) -> dict[str, Any]:
    return {"runs": runs, "median": {k: median_of(v) for k, v in runs.items()}, **extra}


def restart(bench: Bench) -> dict[str, Any]:
    """Half the trace, an engine restart (the daemon keeps its chunks), the second half measured.

    A restarted engine holds nothing but what the daemon kept: a second engine process, started beforehand and
    its prefix cache emptied, takes the second half (the roles swap each repeat), as after a rolling restart,
    without a start of minutes on a busy small machine between the halves (``--real-restart`` restarts the
    first process instead). vLLM alone: the second half on its first engine (never restarted) and on its
    second (restarted)."""
    first, second = halves(conversation_trace(bench.profile.conversations))
    t1, t2 = trace_file(bench, "restart-1", first), trace_file(bench, "restart-2", second)
    bench.start_all(BIG)
    on, off = [bench.get(*BIG[0]), bench.get(*BIG[1])], [bench.get(*BIG[2]), bench.get(*BIG[3])]
    check = agreement(bench, on[0], off[0])
    runs: dict[str, list[dict[str, Any]]] = {"kvstore": [], "vllm_restarted": [], "vllm_never_restarted": []}
    for r, order in enumerate(interleaved(["kvstore", "vllm"], bench.profile.repeats)):
        for name in order:
            a, b = (on if name == "kvstore" else off)[r % 2], (on if name == "kvstore" else off)[1 - r % 2]
            fresh(bench, a, name == "kvstore")
            bench.replay(a.url, [a], *t1, connector=name == "kvstore")
            if name == "vllm":
                runs["vllm_never_restarted"].append(bench.replay(a.url, [a], *t2, connector=False))
            if bench.real_restart:
                b = bench.restart(a)
            b.reset_prefix_cache()
            runs["kvstore" if name == "kvstore" else "vllm_restarted"].append(
                bench.replay(b.url, [b], *t2, connector=name == "kvstore"))
            on, off = [bench.get(*BIG[0]), bench.get(*BIG[1])], [bench.get(*BIG[2]), bench.get(*BIG[3])]
    out = finish(runs, agreement=check, requests=[len(first), len(second)], measured="second half",
                 restart="a new process" if bench.real_restart else "a second engine process, cache emptied")
    out["ratios"] = {"kvstore_vs_never_restarted": ratio(out, "kvstore", "vllm_never_restarted"),
                     "kvstore_vs_restarted": ratio(out, "kvstore", "vllm_restarted")}
    out["goals"] = {"kvstore_vs_never_restarted": 0.9, "kvstore_vs_restarted": 1.5}
    return out


def all_miss(bench: Bench) -> dict[str, Any]:
    """Unique prompts: nothing to hit, the connector's cost (lookups and saves)."""
    p = bench.profile
    trace = trace_file(bench, "unique", unique_trace(p.unique_requests, p.unique_blocks,
                                                     p.conversations.block_tokens, p.conversations.output_tokens))
    on, off = pair(bench)
    out = finish(compare(bench, {"kvstore": ([on], on.url), "vllm": ([off], off.url)}, trace, {"kvstore"}))
    out["ratios"] = {"kvstore_vs_vllm": ratio(out, "kvstore", "vllm", "total_token_throughput")}
    out["goals"] = {"kvstore_vs_vllm": 0.97}
    return out


def slice_rows(bench: Bench, path: str) -> list[dict]:
    p = bench.profile
    rows = conversation_slice(read_rows(path, 1 << 20), p.slice_conversations)
    scaled = scaled_slice(rows, 512, p.conversations.block_tokens, p.slice_max_blocks,
                          p.conversations.output_tokens, 1.0)
    return compress_time(scaled, p.slice_span_ms)


def trace_slice(bench: Bench, path: str) -> dict[str, Any]:
    """A scaled slice of the shared Mooncake conversation trace (its first multi-turn conversations)."""
    rows = slice_rows(bench, path)
    trace = trace_file(bench, "slice", rows)
    on, off = pair(bench)
    out = finish(compare(bench, {"kvstore": ([on], on.url), "vllm": ([off], off.url)}, trace, {"kvstore"}),
                 requests=len(rows), prompt_tokens=sum(r["input_length"] for r in rows),
                 working_set_tokens=working_set_tokens(rows, bench.profile.conversations.block_tokens))
    out["ratios"] = {"kvstore_vs_vllm": ratio(out, "kvstore", "vllm")}
    return out


class Proxy(ProxyProcess):
    """`serve_proxy.py` (round robin) in the engine's virtualenv, in front of `backends`."""

    def __init__(self, bench: Bench, backends: list[Server]) -> None:
        super().__init__(bench.venv.python, "serve_proxy.py", [b.url for b in backends], bench.env, bench.workdir,
                         timeout_s=120)


def replicas(bench: Bench) -> dict[str, Any]:
    """Two engines behind a round-robin proxy: with one daemon between them, and without."""
    trace = trace_file(bench, "conversations", conversation_trace(bench.profile.conversations))
    bench.start_all(BIG)
    on, off = [bench.get(*BIG[0]), bench.get(*BIG[1])], [bench.get(*BIG[2]), bench.get(*BIG[3])]
    proxies = [Proxy(bench, on), Proxy(bench, off)]
    try:
        runs = compare(bench, {"kvstore": (on, proxies[0].url), "vllm": (off, proxies[1].url)}, trace, {"kvstore"})
    finally:
        for p in proxies:
            p.close()
    out = finish(runs, routing="round robin over 2 replicas, no cache-aware routing")
    out["ratios"] = {"kvstore_vs_vllm": ratio(out, "kvstore", "vllm")}
    out["goals"] = {"kvstore_vs_vllm": 1.5}
    bench.keep()
    return out


def working_set_trace(p: Profile) -> tuple[Conversations, int]:
    """More sessions of the conversation trace until its working set is 1/kv_fraction times an engine
    cache that still holds `ws_concurrency` of its longest requests; returns (trace, engine blocks)."""
    c = p.conversations
    need = p.ws_concurrency * -(-(c.longest_prompt() + c.output_tokens) // CPU_BLOCK)
    while c.unique_tokens() * p.kv_fraction < need * CPU_BLOCK:
        c = replace(c, sessions=c.sessions + 1)
    return c, max(need, int(c.unique_tokens() * p.kv_fraction) // CPU_BLOCK)


def peer_arms(bench: Bench) -> dict[str, Arm]:
    """vLLM's native CPU offloading and LMCache's connector, each with the daemon's DRAM budget."""
    gib = bench.profile.host_mem
    size = float(gib[:-3]) if gib.endswith("GiB") else float(gib[:-3]) / 1024
    arms = {"vllm_native_offload": Arm("native", args=("--kv-offloading-backend", "native",
                                                       "--kv-offloading-size", f"{size:g}"))}
    if bench.lmcache_site:
        lm = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})
        env = (("PYTHONPATH", f"{bench.lmcache_site}:{bench.env['PYTHONPATH']}"), ("LMCACHE_CHUNK_SIZE", "256"),
               ("LMCACHE_LOCAL_CPU", "True"), ("LMCACHE_MAX_LOCAL_CPU_SIZE", f"{size:g}"),
               ("LMCACHE_TRACK_USAGE", "false"), ("LMCACHE_DISABLE_BANNER", "1"))
        arms["lmcache"] = Arm("lmcache", args=("--kv-transfer-config", lm), env=env)
    else:
        bench.peer_errors["lmcache"] = ("not installed: give --lmcache-site DIR, a directory made with the engine "
                                        "python's `pip install --target DIR --no-deps lmcache` and its CPU deps")
    return arms


def working_set(bench: Bench) -> dict[str, Any]:
    """The engine's KV cache a quarter of the trace's working set: vLLM's prefix cache thrashes."""
    c, blocks = working_set_trace(bench.profile)
    trace = trace_file(bench, "working-set", conversation_trace(c))
    bench.keep()
    peers = peer_arms(bench)
    failed = bench.start_all([(KVSTORE, blocks, 0), (VLLM, blocks, 0), *[(a, blocks, 0) for a in peers.values()]])
    on, off = pair(bench, blocks)
    arms: dict[str, tuple[list[Server], str]] = {"kvstore": ([on], on.url), "vllm": ([off], off.url)}
    for name, arm in peers.items():
        if (arm, blocks, 0) in failed:
            bench.peer_errors[name] = failed[(arm, blocks, 0)]
        else:
            peer = bench.get(arm, blocks)
            broken = peer_broken(peer.log())
            if broken:   # it serves, but without its cache: not a peer measurement
                bench.peer_errors[name] = broken
                bench.keep(*[s for s in bench.running.values() if s is not peer])
            else:
                arms[name] = ([peer], peer.url)
    check = agreement(bench, on, off)
    out = finish(compare(bench, arms, trace, {"kvstore"}, bench.profile.ws_concurrency), agreement=check,
                 concurrency=bench.profile.ws_concurrency, engine_blocks=blocks,
                 engine_kv_tokens=blocks * CPU_BLOCK, working_set_tokens=c.unique_tokens(), sessions=c.sessions,
                 peers_not_run=dict(bench.peer_errors))
    out["ratios"] = {"kvstore_vs_vllm": ratio(out, "kvstore", "vllm"),
                     **{f"kvstore_vs_{n}": ratio(out, "kvstore", n) for n in arms if n not in ("kvstore", "vllm")}}
    out["goals"] = {"kvstore_vs_vllm": 2.0, "kvstore_vs_vllm_native_offload": 1.0}
    bench.keep()
    return out


def scenario_funcs(trace_path: str) -> dict[str, Callable[[Bench], dict[str, Any]]]:
    return {"restart": restart, "all_miss": all_miss, "slice": lambda b: trace_slice(b, trace_path),
            "replicas": replicas, "working_set": working_set}
