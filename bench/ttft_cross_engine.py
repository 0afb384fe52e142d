"""Time to first token of a cross-engine load ÷ a same-engine load of a prefix of the same length.

    python -m bench.ttft_cross_engine [--repeats 7] [--prompt-chunks 8] [--quick]

One daemon (DRAM only), one random-weight float32 Llama directory, two real CPU engines on it: vLLM at TP=1
with the kvstore connector, and SGLang with HiCache and the kvstore backend (``--page-size`` 256, the vLLM
connector's chunk; ``reset_on_flush`` false, since the benchmark flushes SGLang's own caches). Per repeat, two
fresh prompts of ``--prompt-chunks`` chunks plus one token: one saved by vLLM, one by SGLang. Then each engine
forgets its own cache and loads both, in turns (the first of the pair alternates from repeat to repeat), and
the time of each one-token request is taken: vLLM's time to its first token, SGLang's request time. Every load
must bring in every whole chunk (vLLM's ``chunks_loaded``, SGLang's tokens from storage) and give the same
token as the loading engine's plain prefill (the same prompt under a cache salt nothing else uses). Medians
over the repeats but the first (a warm-up); the goal is a cross-engine load within 1.1× a same-engine one.

Writes bench/results/ttft-cross-engine-latest.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from bench._common import start_daemon, write_result
from harness.engines import sglang_real, vllm_real
from harness.engines.sandbox import engine_home_env
from harness.wait import wait_for

CHUNK = 256     # the vLLM connector's chunk_tokens and SGLang's page size
GOAL = 1.1


class Engines:
    """The two engines on one daemon, each with the calls the measurement needs."""

    def __init__(self, daemon: Any, model: str, workdir: str) -> None:
        self.daemon = daemon
        self.pool = vllm_real.EnginePool()
        self.pool.use_workdir(workdir)
        self.pool.use_model(model)
        self.vllm = self.pool.get("xe-bench", connector=self.pool.connector(), max_model_len=4096)
        flags = sglang_real.hicache_flags(daemon.address, reset_on_flush=False)
        self.sglang = sglang_real.SGLangServer(sglang_real.require_engine(), model,
                                               ["--page-size", str(CHUNK), *flags], workdir, "xe-bench")

    def close(self) -> None:
        self.sglang.close()
        self.pool.close()

    def save(self, engine: str, prompt: list[int]) -> None:
        if engine == "vllm":
            self.vllm.generate([prompt], 1)
        else:
            self.sglang.generate([prompt], 1)

    def plain_token(self, engine: str, prompt: list[int]) -> int:
        """The loading engine's own plain prefill of ``prompt`` (under a salt nothing else uses)."""
        if engine == "vllm":
            return self.vllm.generate([prompt], 1, salts=["plain"])[0]["tokens"][0]
        return self.sglang.generate([prompt], 1, cache_salt="plain")[0]["tokens"][0]

    def timed_load(self, engine: str, prompt: list[int], chunks: int) -> tuple[float, int]:
        """Seconds to the first token of ``prompt`` after ``engine`` forgot its own cache, and that token."""
        if engine == "vllm":
            self.vllm.reset_prefix_cache()
            before = self.vllm.stats()
            out = self.vllm.generate([prompt], 1)[0]
            loaded = vllm_real.delta(self.vllm.stats(), before, "worker", "chunks_loaded")
            seconds = out["ttft"]
        else:
            self.sglang.flush_cache()
            started = time.perf_counter()
            out = self.sglang.generate([prompt], 1)[0]
            seconds = time.perf_counter() - started
            loaded = out["from_storage"] // CHUNK
        if loaded != chunks:
            raise SystemExit(f"{engine} loaded {loaded} chunks of a {chunks}-chunk prefix: not a whole hit")
        return seconds, out["tokens"][0]


def wait_for_count(daemon: Any, want: int, timeout: float = 120) -> None:
    """Until the daemon holds ``want`` chunks (the engines save after they answer)."""
    if not wait_for(lambda: sglang_real.stored(daemon) >= want, timeout=timeout, interval=0.1):
        raise SystemExit("the engines' saves did not reach the daemon in time")


def settled_count(daemon: Any, quiet_s: float = 1.0, timeout: float = 120) -> int:
    """The daemon's chunk count once no save has arrived for ``quiet_s`` (the plain runs save theirs too)."""
    deadline = time.monotonic() + timeout
    count = sglang_real.stored(daemon)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = sglang_real.stored(daemon)
        if now == count:
            return count
        count = now
    raise SystemExit("the daemon's chunk count did not settle")


def measure(engines: Engines, repeats: int, chunks: int) -> dict[str, Any]:
    """Per loading engine, the same-engine and cross-engine load times (seconds), warm-up repeat dropped."""
    length = chunks * CHUNK + 1
    times: dict[str, dict[str, list[float]]] = {e: {"same": [], "cross": []} for e in ("vllm", "sglang")}
    for r in range(repeats + 1):
        saved_by = {"vllm": vllm_real.prompts(1, length, seed=1000 + 2 * r)[0],
                    "sglang": vllm_real.prompts(1, length, seed=1001 + 2 * r)[0]}
        held = settled_count(engines.daemon)
        for engine, prompt in saved_by.items():
            engines.save(engine, prompt)
        wait_for_count(engines.daemon, held + 2 * chunks)
        for loader in ("vllm", "sglang"):
            other = "sglang" if loader == "vllm" else "vllm"
            order = [loader, other] if r % 2 == 0 else [other, loader]
            for saver in order:
                seconds, token = engines.timed_load(loader, saved_by[saver], chunks)
                if token != engines.plain_token(loader, saved_by[saver]):
                    raise SystemExit(f"{loader} loading what {saver} saved gave another first token")
                if r > 0:
                    times[loader]["same" if saver == loader else "cross"].append(seconds)
    found: dict[str, Any] = {}
    for loader, got in times.items():
        same, cross = statistics.median(got["same"]), statistics.median(got["cross"])
        found[loader] = {"same_s": same, "cross_s": cross, "cross_over_same": cross / same,
                         "same_samples": got["same"], "cross_samples": got["cross"]}
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--prompt-chunks", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="2 repeats of 2-chunk prompts")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.prompt_chunks = 2, 2
    for module in (vllm_real, sglang_real):
        if module.engine_python() is None:
            print(module.skip_reason(), file=sys.stderr)
            return 2
    daemon = start_daemon("--host-mem", "2GiB", tcp=False)
    workdir = daemon.workdir
    engines = None
    try:
        model = sglang_real.save_model(sglang_real.require_engine(), f"{workdir}/model", "shared",
                                       engine_home_env(workdir))
        engines = Engines(daemon.daemon, model, workdir)
        found = measure(engines, args.repeats, args.prompt_chunks)
    finally:
        if engines is not None:
            engines.close()
        daemon.stop()
    path = write_result("ttft-cross-engine", {"repeats": args.repeats, "prompt_tokens": args.prompt_chunks * CHUNK + 1,
                                              "chunk_tokens": CHUNK, "goal": GOAL, **found}, quick=args.quick)
    for loader in ("vllm", "sglang"):
        f = found[loader]
        print(f"{loader} loads: same engine {f['same_s'] * 1e3:.1f} ms, cross engine {f['cross_s'] * 1e3:.1f} ms: "
              f"{f['cross_over_same']:.3f}× (goal ≤ {GOAL}×)")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
