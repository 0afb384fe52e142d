"""SGLang side by side, as operators measure it: HiCache alone, with SGLang's `file` and `mooncake` backends, and
with kvstore, driven by SGLang's own benchmark client.

    python -m bench.serve_sglang [--quick] [--scenarios restart,working_set,all_miss] [--repeats N]

Four `sglang.launch_server` processes of SGLang's CPU path (its virtualenv: ``KVSTORE_SGLANG_VENV``, default
``${XDG_CACHE_HOME:-~/.cache}/kvstore-dev/venv-sglang``, made by ``.ci/install-sglang-engine.sh``), one per arm,
the same random-weight float32 Llama (`bench/serve_model.py`), the same paged KV pool and HiCache host pool,
and the same DRAM for the stores that keep pages in DRAM (kvstore's host tier, Mooncake's storage node);
`bench/serve_sglang_engine.py` says how each arm is configured. `python -m sglang.bench_serving --dataset-name
mooncake` replays Mooncake-format rows made from the shared conversation trace by `bench/serve_traces.py`
(its first multi-turn conversations, prompts cut to a few hash ids, arrivals squeezed), each arm's repeat from
empty caches and an empty store, repeats interleaved (each arm first in turn), medians reported:

* **restart**: the first half of the trace, then the engine restarted with its store kept (default: its own
  caches emptied by `/flush_cache`, which is all a restart takes from it, since every store here lives outside
  the engine; ``--real-restart``: a new process), the second half measured;
* **working_set**: the engine's KV pool a quarter of the trace's working set (more conversations of the trace);
* **all_miss**: prompts sharing nothing: what each backend costs when it never hits.

Before the scenarios, prompts are answered by HiCache alone (a plain prefill) and by every storage arm from
its store (after `/flush_cache`): tokens equal and first-token log-probabilities within 1e-3, or the run says
so in its JSON and exits non-zero. Writes bench/results/serve-sglang-latest.json (``--quick``: a temporary
file); `python -m bench.serve_sglang_report RESULT` prints its table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from kvstore.cli.flag_types import positive_count
from bench._common import parse_names, short_tempdir, start_daemon, write_result
from bench.serve_harness import interleaved, median_of
from bench.serve_sglang_engine import (
    ARMS,
    EngineShape,
    Server,
    Venv,
    Client,
    base_flags,
    find_venv,
    mooncake_binaries,
    storage_flags,
    summarize,
    wait_until,
)
from bench.serve_traces import (
    compress_time,
    conversation_slice,
    halves,
    read_rows,
    scaled_slice,
    unique_trace,
    write_jsonl,
)

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = "/work/shared/traces/conversation_trace.jsonl"
SCENARIOS = ("restart", "working_set", "all_miss")
INSTALL_HINT = "bash .ci/install-sglang-engine.sh"
# SGLang's client writes each hash id of a row as its digits and then "hi" 128 times: with the bench model's
# tokenizer (`serve_model.py --digit-words`) that is 128 tokens and one per digit
CLIENT_BLOCK_TOKENS = 130
TRACE_BLOCK = 512          # tokens of a hash id in Mooncake's trace
LOGPROB_TOL = 1e-3


@dataclass(frozen=True)
class Profile:
    """Everything a run's size depends on: the model, the engines' pools, the traces, concurrency, repeats."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    repeats: int = 3
    concurrency: int = 2
    page: int = 16
    pool_tokens: int = 2048            # the engine's paged KV pool (--max-total-tokens)
    hicache_ratio: float = 2.0         # HiCache's host pool / the device pool
    store_mib: int = 1024              # kvstore's host tier, Mooncake's storage node (the same DRAM)
    max_blocks: int = 6                # hash ids a prompt is cut to
    output_tokens: int = 8
    restart_conversations: int = 6
    restart_span_ms: int = 4000        # each half's arrivals, squeezed into this
    kv_fraction: float = 0.25          # working_set: the engine's KV pool / the trace's working set
    ws_span_ms: int = 8000
    unique_requests: int = 6
    unique_blocks: int = 6
    check_prompts: int = 2
    check_tokens: int = 6
    check_length: int = 40 * 16        # tokens of an agreement prompt (SGLang asks storage past 256 new ones)

    def model_desc(self) -> str:
        return (f"random-weight Llama, hidden {self.hidden}, {self.layers} layers, {self.heads} heads, "
                f"{self.kv_heads} KV heads, float32, vocab 512 (word-level tokenizer, digits and `hi` as words)")

    def kv_bytes_per_token(self) -> int:
        return self.layers * self.kv_heads * (self.hidden // self.heads) * 2 * 4

    def shape(self) -> EngineShape:
        return EngineShape(self.page, self.pool_tokens, self.hicache_ratio, max(8, 2 * self.concurrency))


FULL = Profile("full", hidden=512, layers=4, heads=8, kv_heads=2)
QUICK = Profile("quick", hidden=128, layers=2, heads=4, kv_heads=2, repeats=1, store_mib=256, restart_conversations=4,
                kv_fraction=0.5, restart_span_ms=2000, ws_span_ms=4000, unique_requests=3, check_prompts=1,
                check_tokens=4)


def parse_scenarios(text: str) -> list[str]:
    return parse_names(text, "--scenarios", SCENARIOS)


def parse_arms(text: str) -> list[str]:
    names = parse_names(text, "--arms", ARMS)
    if "hicache" not in names or "kvstore" not in names:
        raise SystemExit(f"--arms: hicache and kvstore are needed; choose from {','.join(ARMS)}")
    return [a for a in ARMS if a in names]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model, few requests, one repeat (smoke test)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, in this order")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated (hicache and kvstore always)")
    parser.add_argument("--repeats", type=positive_count, default=None, help="interleaved repeats per scenario")
    parser.add_argument("--concurrency", type=positive_count, default=None, help="requests in flight (client)")
    parser.add_argument("--venv", default=None, help="SGLang's virtualenv (default: the engine tests')")
    parser.add_argument("--trace", default=TRACE, help="the Mooncake conversation trace the rows come from")
    parser.add_argument("--real-restart", action="store_true",
                        help="restart: a new engine process halfway (default: its caches emptied)")
    parser.add_argument("--note", default="", help="a line kept in the result (what else ran on the machine)")
    parser.add_argument("--out", default=None, help="write the result here instead")
    args = parser.parse_args(argv)
    args.scenarios = parse_scenarios(args.scenarios)
    args.arms = parse_arms(args.arms)
    return args


def profile_for(args: argparse.Namespace) -> Profile:
    base = QUICK if args.quick else FULL
    return replace(base, **{k: getattr(args, k) for k in ("repeats", "concurrency") if getattr(args, k) is not None})


# ---- traces -------------------------------------------------------------------------------------------------


def trace_rows(path: str, conversations: int, p: Profile, span_ms: int) -> list[dict]:
    """The first `conversations` multi-turn conversations of the Mooncake trace, prompts cut to `max_blocks` hash
    ids, outputs to `output_tokens`, arrivals squeezed into `span_ms` (`bench/serve_traces.py`)."""
    rows = conversation_slice(read_rows(path, 1 << 20), conversations)
    scaled = scaled_slice(rows, TRACE_BLOCK, CLIENT_BLOCK_TOKENS, p.max_blocks, p.output_tokens, 1.0)
    return compress_time(scaled, span_ms)


def working_set_tokens(rows: list[dict]) -> int:
    """Tokens of distinct KV the rows make as SGLang's client writes them (every hash id, whole)."""
    return len({h for r in rows for h in r["hash_ids"]}) * CLIENT_BLOCK_TOKENS


def longest_request(p: Profile) -> int:
    return p.max_blocks * CLIENT_BLOCK_TOKENS + 16 + p.output_tokens


def working_set_rows(path: str, p: Profile) -> tuple[list[dict], int]:
    """More conversations of the trace until its working set is the engine's KV pool / `kv_fraction`."""
    if p.concurrency * longest_request(p) > p.pool_tokens:
        raise ValueError(f"a KV pool of {p.pool_tokens} tokens cannot hold {p.concurrency} requests of "
                         f"{longest_request(p)} tokens")
    want = p.pool_tokens / p.kv_fraction
    n = p.restart_conversations
    rows = trace_rows(path, n, p, p.ws_span_ms)
    while working_set_tokens(rows) < want:
        n += 1
        more = trace_rows(path, n, p, p.ws_span_ms)
        if len(more) == len(rows):
            raise ValueError(f"{path}: not enough conversations for a working set of {want:.0f} tokens")
        rows = more
    return rows, n


def write_rows(bench: Bench, name: str, rows: list[dict]) -> tuple[str, int]:
    return write_jsonl(rows, os.path.join(bench.workdir, f"trace-{name}.jsonl")), len(rows)


# ---- the run's engines and stores --------------------------------------------------------------------------


@dataclass
class Bench:
    """A run's shared parts: SGLang's virtualenv, the scratch directory, the model, the stores, one engine per
    arm."""

    venv: Venv
    profile: Profile
    workdir: str
    arms: list[str]
    real_restart: bool = False
    model: str = ""
    daemon: Any = None
    mooncake: Any = None
    files: str = ""
    engines: dict[str, Server] | None = None
    client: Client | None = None
    counter: int = 0

    def setup(self) -> None:
        import subprocess

        from harness.engines.sandbox import engine_home_env

        p = self.profile
        self.model = os.path.join(self.workdir, "model")
        env = {**os.environ, **engine_home_env(self.workdir)}
        subprocess.run([self.venv.python, os.path.join(HERE, "serve_model.py"), self.model, "--hidden", str(p.hidden),
                        "--layers", str(p.layers), "--heads", str(p.heads), "--kv-heads", str(p.kv_heads),
                        "--max-len", "8192", "--digit-words"], check=True, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=600)
        self.daemon = start_daemon("--host-mem", f"{p.store_mib}MiB", "--disk-size", "0", tcp=False)
        self.files = os.path.join(self.workdir, "hicache-files")
        if "mooncake" in self.arms:
            from pathlib import Path

            from harness.servers import MooncakeCluster

            binaries = mooncake_binaries(self.venv)
            assert binaries is not None
            self.mooncake = MooncakeCluster(Path(self.workdir) / "mooncake", segment_size=f"{p.store_mib}MB",
                                            master=binaries[0], node=binaries[1]).start()
        self.engines = {}
        errors: dict[str, BaseException] = {}
        self.client = Client(self.venv, self.workdir)

        def start(arm: str) -> None:
            try:
                self.engines[arm] = self.start_engine(arm)
            except BaseException as exc:   # noqa: BLE001 - reported below, the other arms still close
                errors[arm] = exc

        threads = [threading.Thread(target=start, args=(arm,)) for arm in self.arms]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError("; ".join(f"{arm}: {str(e).splitlines()[0]}" for arm, e in errors.items()))
        self.client.wait_ready()

    def store_of(self, arm: str) -> Any:
        return {"file": self.files, "mooncake": self.mooncake, "kvstore": self.daemon and self.daemon.ipc}.get(arm)

    def start_engine(self, arm: str) -> Server:
        self.counter += 1
        flags = [*base_flags(self.profile.shape()), *storage_flags(arm, self.store_of(arm))]
        return Server(self.venv.python, self.model, flags, self.workdir, f"{arm}-{self.counter}")

    def restart(self, arm: str) -> Server:
        """The engine of `arm` after a restart, its store kept: a new process (``--real-restart``), else the same
        one with its device and host caches emptied."""
        assert self.engines is not None
        if self.real_restart:
            self.engines[arm].close()
            self.engines[arm] = self.start_engine(arm)
            self.use(arm)
        else:
            self.engines[arm].flush_cache()
        return self.engines[arm]

    def use(self, arm: str) -> Server:
        """`arm`'s engine, running, every other arm's paused (`Server.pause`)."""
        assert self.engines is not None
        for name, engine in self.engines.items():
            if name != arm:
                engine.pause()
        self.engines[arm].resume()
        return self.engines[arm]

    def clear(self, arm: str) -> None:
        """Empty `arm`'s engine caches and its store, so a repeat starts cold: SGLang's own clear for the file and
        Mooncake backends, a fresh daemon for kvstore (its backend deletes nothing when SGLang asks: other
        engines share the pages); then one request new to every cache, so the backend has found its store again
        before the measured requests (and `/flush_cache` drops it)."""
        engine = self.use(arm)
        engine.flush_cache()
        if arm in ("file", "mooncake"):
            engine.clear_storage()
        elif arm == "kvstore":
            self.daemon.daemon.restart()
        self.counter += 1
        rng = random.Random(10_000 + self.counter)
        engine.generate([[rng.randrange(14, 512) for _ in range(self.profile.check_length)]], 1)
        engine.flush_cache()

    def replay(self, arm: str, trace: tuple[str, int], concurrency: int | None = None) -> dict[str, Any]:
        assert self.engines is not None and self.client is not None
        self.counter += 1
        record = self.client.run(self.engines[arm].url, self.model, trace[0], trace[1],
                                 concurrency or self.profile.concurrency, f"client-{self.counter}-{arm}")
        return summarize(record, trace[1])

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        for engine in (self.engines or {}).values():
            engine.close()
        if self.mooncake is not None:
            self.mooncake.stop()
        if self.daemon is not None:
            self.daemon.stop()
        if not os.environ.get("KVSTORE_KEEP_TEST_DIRS"):
            shutil.rmtree(self.workdir, ignore_errors=True)


# ---- agreement and scenarios -------------------------------------------------------------------------------


def stored_count(bench: Bench, arm: str) -> int | None:
    """Pages `arm`'s store holds, where it can be counted from outside (None: Mooncake)."""
    if arm == "kvstore":
        with bench.daemon.daemon.client() as c:
            return int(c.stats()["chunks"])
    if arm == "file":
        return len(os.listdir(bench.files)) if os.path.isdir(bench.files) else 0
    return None


def agreement(bench: Bench) -> dict[str, Any]:
    """Prompts answered by HiCache alone from a plain prefill and by each storage arm from its store (stored by a
    first answer, then `/flush_cache`): the same tokens and first-token log-probabilities within 1e-3."""
    assert bench.engines is not None
    p = bench.profile
    rng = random.Random(7)
    prompts = [[rng.randrange(14, 512) for _ in range(p.check_length)] for _ in range(p.check_prompts)]
    plain = bench.use("hicache")
    plain.flush_cache()
    want = plain.generate(prompts, p.check_tokens)
    if any(w["cached"] for w in want):
        raise RuntimeError(f"the reference prefill found cached tokens: {[w['cached'] for w in want]}")
    out: dict[str, Any] = {"prompts": p.check_prompts, "prompt_tokens": p.check_length, "tolerance": LOGPROB_TOL,
                           "arms": {}}
    pages = p.check_prompts * (p.check_length // p.page)
    for arm in bench.arms:
        if arm == "hicache":
            continue
        bench.clear(arm)
        engine = bench.engines[arm]
        engine.generate(prompts, p.check_tokens)                 # stored
        if stored_count(bench, arm) is not None:
            wait_until(lambda a=arm: stored_count(bench, a) >= pages, 60)
        got, tries = [], 0
        while tries < 5:
            tries += 1
            engine.flush_cache()
            got = engine.generate(prompts, p.check_tokens)      # loaded from the store
            if all(g["from_storage"] >= p.check_length - 2 * p.page for g in got):
                break
            wait_until(lambda: False, 1.0)
        first = max(abs(g["logprobs"][0] - w["logprobs"][0]) for g, w in zip(got, want))
        worst = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g["logprobs"], w["logprobs"]))
        same = all(g["tokens"] == w["tokens"] for g, w in zip(got, want))
        loaded = sum(g["from_storage"] for g in got)
        out["arms"][arm] = {"tokens_equal": same, "first_token_logprob_difference": first,
                            "max_logprob_difference": worst, "tokens_loaded_from_storage": loaded,
                            "agree": same and first <= LOGPROB_TOL and loaded > 0}
    out["agree"] = all(a["agree"] for a in out["arms"].values())
    return out


def finish(runs: dict[str, list[dict[str, Any]]], **extra: Any) -> dict[str, Any]:
    return {"runs": runs, "median": {k: median_of(v) for k, v in runs.items()}, **extra}


GOALS = {"kvstore_vs_file": 1.5, "kvstore_vs_mooncake": 1.0}


def ratios(out: dict[str, Any], arms: list[str], key: str = "request_throughput",
           goals: dict[str, float] | None = None) -> None:
    """kvstore against each other arm: `key` (higher is better) and median TTFT (the other arm's over kvstore's),
    with the goals of issue 39 on both."""
    med = out["median"]
    out["ratios"], out["goals"] = {}, {}
    for other in arms:
        if other == "kvstore":
            continue
        name = f"kvstore_vs_{other}"
        x, y = med.get("kvstore", {}).get(key), med.get(other, {}).get(key)
        out["ratios"][f"{key}_{name}"] = x / y if x and y else None
        a, b = med.get("kvstore", {}).get("median_ttft_ms"), med.get(other, {}).get("median_ttft_ms")
        out["ratios"][f"ttft_speedup_{name}"] = b / a if a and b else None
        goal = (goals or GOALS).get(name)
        if goal is not None:
            out["goals"][f"{key}_{name}"] = goal
            out["goals"][f"ttft_speedup_{name}"] = goal


def restart(bench: Bench, path: str) -> dict[str, Any]:
    """The first half of the trace, an engine restart with the store kept, the second half measured."""
    p = bench.profile
    rows = trace_rows(path, p.restart_conversations, p, 2 * p.restart_span_ms)
    first, second = halves(rows)
    t1, t2 = write_rows(bench, "restart-1", first), write_rows(bench, "restart-2", second)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in bench.arms}
    for order in interleaved(bench.arms, p.repeats):
        for arm in order:
            bench.clear(arm)
            bench.replay(arm, t1)
            bench.restart(arm)
            runs[arm].append(bench.replay(arm, t2))
    out = finish(runs, requests=[len(first), len(second)], measured="second half",
                 working_set_tokens=working_set_tokens(rows), conversations=p.restart_conversations,
                 restart="a new engine process" if bench.real_restart else "/flush_cache (device and host pools "
                 "emptied, the store kept)")
    ratios(out, bench.arms)
    return out



def replay_interleaved(bench: Bench, trace: tuple[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Every arm's replays of ``trace``, repeats interleaved (each arm first in turn), each from an empty store."""
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in bench.arms}
    for order in interleaved(bench.arms, bench.profile.repeats):
        for arm in order:
            bench.clear(arm)
            runs[arm].append(bench.replay(arm, trace))
    return runs

def working_set(bench: Bench, path: str) -> dict[str, Any]:
    """The engine's KV pool a quarter of the trace's working set: HiCache alone thrashes."""
    p = bench.profile
    rows, n = working_set_rows(path, p)
    trace = write_rows(bench, "working-set", rows)
    runs = replay_interleaved(bench, trace)
    out = finish(runs, requests=len(rows), conversations=n, working_set_tokens=working_set_tokens(rows),
                 engine_kv_tokens=p.pool_tokens, host_pool_tokens=int(p.pool_tokens * p.hicache_ratio))
    ratios(out, bench.arms)
    return out


def all_miss(bench: Bench, path: str) -> dict[str, Any]:
    """Prompts sharing nothing: every backend's cost of looking up and saving what is never read again."""
    p = bench.profile
    rows = unique_trace(p.unique_requests, p.unique_blocks, CLIENT_BLOCK_TOKENS, p.output_tokens, gap_ms=50)
    trace = write_rows(bench, "unique", rows)
    runs = replay_interleaved(bench, trace)
    out = finish(runs, requests=len(rows))
    med = out["median"]
    out["ratios"] = {f"total_throughput_{arm}_vs_hicache":
                     (med[arm]["total_throughput"] / med["hicache"]["total_throughput"]
                      if med[arm].get("total_throughput") and med["hicache"].get("total_throughput") else None)
                     for arm in bench.arms if arm != "hicache"}
    out["goals"] = {"total_throughput_kvstore_vs_hicache": 0.97}
    return out


SCENARIO_FUNCS: dict[str, Callable[[Bench, str], dict[str, Any]]] = {
    "restart": restart, "working_set": working_set, "all_miss": all_miss}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    venv = find_venv(args.venv)
    if venv is None:
        print(f"no SGLang engine virtualenv at {args.venv or 'the engine tests’ place'}: `{INSTALL_HINT}` installs "
              "it (KVSTORE_SGLANG_VENV names another)", file=sys.stderr)
        return 2
    not_run: dict[str, str] = {}
    if "mooncake" in args.arms and mooncake_binaries(venv) is None:
        not_run["mooncake"] = (f"Mooncake Store's client is not installed in {venv.root} (`{INSTALL_HINT}` "
                               "installs it)")
        args.arms = [a for a in args.arms if a != "mooncake"]
    profile = profile_for(args)
    bench = Bench(venv, profile, short_tempdir("sgb-"), args.arms, real_restart=args.real_restart)
    result: dict[str, Any] = {
        "profile": asdict(profile), "model": profile.model_desc(), "arms": args.arms, "arms_not_run": not_run,
        "engine": f"sglang {venv.version} CPU path (sglang.launch_server, sglang.bench_serving --dataset-name "
                  "mooncake)",
        "command": "python -m bench.serve_sglang " + " ".join(sys.argv[1:] if argv is None else argv),
        "note": args.note, "scenarios": {}, "load_average_at_start": os.getloadavg()}
    # a SIGTERM (a timeout, an operator) unwinds through `bench.close()`, which stops every server it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        bench.setup()
        print("== agreement", flush=True)
        result["agreement"] = agreement(bench)
        print(json.dumps(result["agreement"]), flush=True)
        for scenario in args.scenarios:
            print(f"== {scenario}", flush=True)
            try:
                result["scenarios"][scenario] = SCENARIO_FUNCS[scenario](bench, args.trace)
            except (RuntimeError, OSError, ValueError) as exc:   # the others still run and are written
                result["scenarios"][scenario] = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps({k: v for k, v in result["scenarios"][scenario].items() if k != "runs"}), flush=True)
    finally:
        bench.close()
    result["outputs_agree"] = result.get("agreement", {}).get("agree")
    result["load_average_at_end"] = os.getloadavg()
    path = write_result("serve-sglang", result, quick=args.quick, out=args.out)
    print(path)
    return 0 if result["outputs_agree"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
