"""The parts of `bench/serve.py`: run profiles, engine arms, one measured replay and its summary, the
run's shared engines and daemon (`Bench`), and the output-agreement check."""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench._common import free_port, start_daemon
from bench.serve_engine import EngineFailed, Server, Venv, bench_serve, engine_env, make_shim
from bench.serve_traces import Conversations
from kvstore.connectors.common import canonical
from kvstore.connectors.common.canonical import canonical_session
from kvstore.keys import KEY_SCHEME
from kvstore.connectors.common.layout import session_namespace

HERE = os.path.dirname(os.path.abspath(__file__))

LOGPROB_TOL = 1e-3


@dataclass(frozen=True)
class Profile:
    """Everything a run's size depends on: the model's shape, the traces, concurrency and repeats."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    conversations: Conversations
    concurrency: int = 4
    ws_concurrency: int = 2            # working_set: fewer in flight, so a quarter-size cache still holds them
    repeats: int = 3
    max_model_len: int = 4096
    chunk_tokens: int = 256
    unique_requests: int = 12
    unique_blocks: int = 8
    slice_conversations: int = 10
    slice_max_blocks: int = 12
    slice_span_ms: int = 30000
    kv_fraction: float = 0.25          # working_set: the engine's KV cache / the trace's working set
    host_mem: str = "2GiB"             # the daemon's DRAM (and the peers' offloading budget)
    check_prompts: int = 3
    check_tokens: int = 8

    def model_desc(self) -> str:
        return (f"random-weight Llama, hidden {self.hidden}, {self.layers} layers, {self.heads} heads, "
                f"{self.kv_heads} KV heads, float32, vocab 512 (word-level tokenizer)")

    def kv_bytes_per_token(self) -> int:
        return self.layers * self.kv_heads * (self.hidden // self.heads) * 2 * 4


FULL = Profile("full", hidden=1024, layers=8, heads=16, kv_heads=4, repeats=2, ws_concurrency=1,
               unique_requests=6, conversations=Conversations(
                   sessions=4, turns=6, systems=2, system_blocks=8, turn_blocks=1, block_tokens=256,
                   output_tokens=8, session_gap_ms=800, turn_gap_ms=1500))
QUICK = Profile("quick", hidden=256, layers=4, heads=4, kv_heads=2, repeats=1, concurrency=2, max_model_len=2048,
                unique_requests=4, unique_blocks=4, slice_conversations=4, slice_max_blocks=6, slice_span_ms=4000,
                check_prompts=2, check_tokens=4, host_mem="512MiB", conversations=Conversations(
                    sessions=4, turns=3, systems=1, system_blocks=2, turn_blocks=1, block_tokens=256,
                    output_tokens=4, session_gap_ms=300, turn_gap_ms=1500))


@dataclass(frozen=True)
class Arm:
    """One engine configuration of a comparison: a label, the connector (or not) and extra server flags."""

    label: str
    connector: bool = False
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


MODEL_ID = "serve-bench"   # every engine's connector files its chunks under one namespace, so a repeat can empty it


def connector_config(address: str, chunk_tokens: int) -> dict[str, Any]:
    return {"kv_connector": "KVStoreConnector", "kv_connector_module_path": "kvstore.connectors.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"address": address, "chunk_tokens": chunk_tokens, "timeout": 5.0,
                                          "model_id": MODEL_ID}}


def rate(hits: float, queries: float) -> float | None:
    return hits / queries if queries > 0 else None


def summarize(client: dict[str, Any], before: dict[str, float], after: dict[str, float],
              daemon_before: dict[str, Any] | None, daemon_after: dict[str, Any] | None) -> dict[str, Any]:
    """One measured replay: the client's figures and the hit rates over it (vLLM's, the connector's as vLLM
    counts it, both together over every prompt token, and the daemon's own)."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    out = {k: client.get(k) for k in ("completed", "failed", "duration", "request_throughput",
                                      "total_token_throughput", "output_throughput", "mean_ttft_ms",
                                      "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "total_input_tokens")}
    out["vllm_hit_rate"] = rate(d["prefix_cache_hits"], d["prefix_cache_queries"])
    out["external_hit_rate"] = rate(d["external_prefix_cache_hits"], d["external_prefix_cache_queries"])
    # prompt tokens not prefilled (vLLM's own hits and the connector's loads) over every prompt token, each request
    # counted once, from vllm:prompt_tokens_by_source
    cached = d.get("prompt_tokens_local_cache_hit", 0.0) + d.get("prompt_tokens_external_kv_transfer", 0.0)
    out["token_hit_rate"] = rate(cached, cached + d.get("prompt_tokens_local_compute", 0.0))
    out["preemptions"] = d["num_preemptions"]
    if daemon_before is not None and daemon_after is not None:
        out["daemon_hit_rate"] = rate(daemon_after["hit_tokens"] - daemon_before["hit_tokens"],
                                      daemon_after["lookup_tokens"] - daemon_before["lookup_tokens"])
    return out


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each numeric field over repeats (None where no repeat had a value)."""
    keys = runs[0].keys() if runs else []
    out: dict[str, Any] = {}
    for k in keys:
        vals = [r[k] for r in runs if isinstance(r.get(k), (int, float))]
        out[k] = statistics.median(vals) if vals else None
    return out


def interleaved(arms: list[str], repeats: int) -> list[list[str]]:
    """Each repeat's order of arms: every arm first in turn."""
    return [arms[r % len(arms):] + arms[:r % len(arms)] for r in range(repeats)]


def ratio(result: dict[str, Any], a: str, b: str, key: str = "request_throughput") -> float | None:
    x, y = result["median"].get(a, {}).get(key), result["median"].get(b, {}).get(key)
    return x / y if x and y else None


@dataclass
class Bench:
    """A run's shared parts: the engine virtualenv, the scratch directory, the model, the daemon."""

    venv: Venv
    profile: Profile
    workdir: str
    lmcache_site: str = ""
    daemon: Any = None
    model: str = ""
    servers: list[Server] = field(default_factory=list)
    running: dict[tuple[Arm, int | None, int], Server] = field(default_factory=dict)
    peer_errors: dict[str, str] = field(default_factory=dict)
    real_restart: bool = False
    counter: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def env(self) -> dict[str, str]:
        return engine_env(self.workdir, os.path.join(self.workdir, "shim"))

    def setup(self) -> None:
        make_shim(os.path.join(self.workdir, "shim"), self.venv.version)
        self.model = os.path.join(self.workdir, "model")
        p = self.profile
        subprocess.run([self.venv.python, os.path.join(HERE, "serve_model.py"), self.model, "--hidden",
                        str(p.hidden), "--layers", str(p.layers), "--heads", str(p.heads), "--kv-heads",
                        str(p.kv_heads), "--max-len", str(max(8192, p.max_model_len))], check=True,
                       env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
        self.daemon = start_daemon("--host-mem", p.host_mem, tcp=False)

    def get(self, arm: Arm, blocks: int | None = None, replica: int = 0) -> Server:
        """The running server of this arm, size and replica number, else a newly started one."""
        key = (arm, blocks, replica)
        server = self.running.get(key)
        if server is None or server.proc is None or server.proc.poll() is not None:
            server = self.server(arm, blocks)
            self.running[key] = server
        return server

    def start_all(self, keys: list[tuple[Arm, int | None, int]]) -> dict[tuple[Arm, int | None, int], str]:
        """Start every (arm, blocks, replica) not running yet, all at once (a start is minutes of imports on a
        busy machine, and starts in parallel overlap); returns the error line of each that failed."""
        failed: dict[tuple[Arm, int | None, int], str] = {}

        def one(key: tuple[Arm, int | None, int]) -> None:
            try:
                self.get(*key)
            except EngineFailed as exc:
                failed[key] = exc.line

        threads = [threading.Thread(target=one, args=(k,)) for k in keys if k not in self.running]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return failed

    def keep(self, *servers: Server) -> None:
        """Stop every running server but these (a few engine processes at a time on a small machine)."""
        for key, s in list(self.running.items()):
            if s not in servers:
                self.stop(s)
                del self.running[key]

    def restart(self, server: Server) -> Server:
        """Stop `server` and start its arm again (same size and replica slot)."""
        key = next(k for k, s in self.running.items() if s is server)
        self.stop(server)
        del self.running[key]
        return self.get(*key)

    def server(self, arm: Arm, blocks: int | None = None) -> Server:
        """A started server of `arm` (kept in `servers` until `stop`)."""
        with self.lock:
            self.counter += 1
            n = self.counter
        p = self.profile
        # a cache of `blocks` (128-token CPU blocks) must hold one request of the longest length vLLM accepts
        length = min(p.max_model_len, (blocks - 1) * 128) if blocks else p.max_model_len  # one block vLLM keeps
        args = ["--max-model-len", str(length), "--max-num-seqs", str(max(8, 2 * p.concurrency)),
                *(["--num-gpu-blocks-override", str(blocks)] if blocks else []), *arm.args]
        if arm.connector:
            args += ["--kv-transfer-config", json.dumps(connector_config(self.daemon.ipc, p.chunk_tokens))]
        env = {**self.env, **dict(arm.env)}
        log = os.path.join(self.workdir, f"serve-{n}-{arm.label}-{blocks or 'default'}.log")
        server = Server(self.venv, self.model, free_port(), log, env, args)
        self.servers.append(server)
        try:
            return server.start()
        except BaseException:
            self.stop(server)
            raise

    def stop(self, server: Server) -> None:
        server.stop()
        if server in self.servers:
            self.servers.remove(server)

    def daemon_stats(self, daemons: list[Any] | None = None) -> dict[str, Any]:
        """The run's daemon's stats, or the lookup and hit tokens summed over ``daemons``."""
        if daemons is None:
            with self.daemon.daemon.client() as c:
                return c.stats()
        totals = {"hit_tokens": 0, "lookup_tokens": 0}
        for d in daemons:
            with d.daemon.client() as c:
                stats = c.stats()
            for k in totals:
                totals[k] += stats[k]
        return totals

    def clear_daemon(self, daemon: Any = None) -> None:
        """Delete every chunk the engines saved (their connector's namespace) from the run's daemon (or `daemon`),
        so a repeat starts cold."""
        left = 0
        for _ in range(10):   # a save the engine acknowledged may still be landing
            for ns, scheme in ((canonical_session(MODEL_ID), canonical.KEY_SCHEME),    # shared, or vLLM's own
                               (session_namespace(f"vllm:{MODEL_ID}"), KEY_SCHEME)):
                with (daemon or self.daemon).daemon.client(namespace=ns, key_scheme=scheme) as c:
                    c.clear()
                    left = c.stats()["chunks"]
            if not left:
                return
            time.sleep(0.5)
        if left:   # a repeat that inherited the last one's chunks would measure nothing
            raise RuntimeError(f"the daemon still holds {left} chunks after clearing the engines' namespace")

    def replay(self, url: str, servers: list[Server], trace: str, num: int, connector: bool,
               concurrency: int | None = None, daemons: list[Any] | None = None) -> dict[str, Any]:
        """`vllm bench serve` of `trace` against `url`; the summary with the servers' counters summed (and the
        daemon's, or those of `daemons` when the servers have their own)."""
        self.counter += 1
        before = [s.metrics() for s in servers]
        dbefore = self.daemon_stats(daemons) if connector else None
        client = bench_serve(self.venv, self.env, url, self.model, trace, self.profile.conversations.block_tokens,
                             num, concurrency or self.profile.concurrency, self.workdir, f"bench-{self.counter}")
        after = [s.metrics() for s in servers]
        def total(ms: list[dict]) -> dict:
            return {k: sum(m[k] for m in ms) for k in ms[0]}

        return summarize(client, total(before), total(after), dbefore,
                         self.daemon_stats(daemons) if connector else None)

    def close(self) -> None:
        for s in list(self.servers):
            s.stop()
        self.servers.clear()
        self.running.clear()
        if self.daemon is not None:
            self.daemon.stop()
        if not os.environ.get("KVSTORE_KEEP_TEST_DIRS"):
            shutil.rmtree(self.workdir, ignore_errors=True)


def check_prompts(profile: Profile, seed: int = 7) -> list[list[int]]:
    """Prompts of four connector chunks and a bit, new to every cache (ids 3..511: no special tokens)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(4 * profile.chunk_tokens + 17)]
            for _ in range(profile.check_prompts)]


def agreement(bench: Bench, on: Server, off: Server) -> dict[str, Any]:
    """The same prompts answered by vLLM alone (prefix cache emptied: a full prefill) and with kvstore (its
    prefix cache emptied after the first answer, so the second comes from the daemon): the same tokens, and
    log-probabilities equal to float32 rounding."""
    worst, same, loaded = 0.0, True, 0
    for prompt in check_prompts(bench.profile):
        off.reset_prefix_cache()
        want = off.complete(prompt, bench.profile.check_tokens)
        on.reset_prefix_cache()
        on.complete(prompt, bench.profile.check_tokens)          # stored in the daemon
        on.reset_prefix_cache()
        before = on.metrics()["external_prefix_cache_hits"]
        got = on.complete(prompt, bench.profile.check_tokens)    # loaded from it
        loaded += int(on.metrics()["external_prefix_cache_hits"] - before)
        same = same and got["tokens"] == want["tokens"]
        worst = max([worst, *(abs(a - b) for a, b in zip(got["logprobs"], want["logprobs"]))])
    return {"prompts": bench.profile.check_prompts, "prompt_tokens": 4 * bench.profile.chunk_tokens + 17,
            "tokens_equal": same, "max_logprob_difference": worst, "tolerance": LOGPROB_TOL,
            "tokens_loaded_from_daemon": loaded, "agree": same and worst <= LOGPROB_TOL and loaded > 0}


