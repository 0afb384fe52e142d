"""Prefill on one vLLM engine, decode on another: two engines sharing one kvstore daemon.

    python -m bench.vllm_router [--prompts 4] [--tokens 1100] [--max-tokens 16]

The prefill engine runs with ``kv_role: kv_producer`` (it saves every full prompt chunk and never loads), the
decode engine with ``kv_role: kv_consumer`` (it loads and never saves). The router sends each request to the
prefill engine for one token, then the whole request to the decode engine, which finds the prompt's KV in the
daemon and only computes the tail: the same tokens as one engine doing both. ``route`` is the router; run as
a script it starts a daemon and both engines (the real vLLM, from the engine virtualenv of
``.ci/install-vllm-engine.sh``), routes a batch, and checks it against a single engine.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Protocol


class Engine(Protocol):
    def generate(self, prompts: list[list[int]], max_tokens: int = 8, **kw: Any) -> list[dict[str, Any]]: ...


def route(prefill: Engine, decode: Engine, prompts: list[list[int]], max_tokens: int) -> list[dict[str, Any]]:
    """Prefill every prompt on `prefill` (which saves its KV), then generate on `decode` (which loads it)."""
    prefill.generate(prompts, 1)
    return decode.generate(prompts, max_tokens)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1100)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    from harness.engines.vllm_real import POOL, engine_python, prompts, skip_reason

    from bench._common import start_daemon

    if engine_python() is None:
        print(skip_reason(), file=sys.stderr)
        return 2
    daemon = start_daemon("--host-mem", "1GiB", tcp=False)
    POOL.use_workdir(daemon.workdir)  # the engines' socket is the daemon's
    try:
        batch = prompts(args.prompts, args.tokens, seed=1)
        one = POOL.get("single", prefix_caching=False).generate(batch, args.max_tokens)
        POOL.keep()
        prefill = POOL.get("prefill", connector=POOL.connector("kv_producer"))
        decode = POOL.get("decode", connector=POOL.connector("kv_consumer"))
        routed = route(prefill, decode, batch, args.max_tokens)
        same = [r["tokens"] == o["tokens"] for r, o in zip(routed, one)]
        print(json.dumps({"same_tokens": same, "decode_stats": decode.stats(), "prefill_stats": prefill.stats()}))
        return 0 if all(same) else 1
    finally:
        POOL.close()
        daemon.stop()


if __name__ == "__main__":
    sys.exit(main())
