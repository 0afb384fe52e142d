"""What verification costs: verified gets, scrubs, the checksum at commit, and engines' online verification.

    python -m bench.verify [--chunk-mib 4] [--chunks 16] [--repeat 7]

Measured in one run, interleaved, medians (the machine is shared and noisy), against memcpy and xxh3 measured
in the same run:

* **get**: lease ``--chunks`` chunks and copy them out (what a connector does), with ``verify=True`` and
  without; the ratio is the bandwidth a verified get keeps.
* **scrub**: ``Client.scrub()`` over a host tier filled with chunks, in bytes checked per second, against
  memcpy and a bare xxh3 pass of the same bytes.
* **commit**: a stream of puts, timed by the writer (the daemon takes sums on its worker, off the put's path),
  and until every sum is taken (the sustained cost, the worker competing with the writer for this machine's
  two cores); beside it, what the alternative design would add to the writer's path: hashing each chunk while
  copying it.
* **engine**: the transformers connector on a small random-weight model, a cache hit of a 1,536-token prefix
  loaded, the same hit verified (computed and compared), and no cache; throughput at a verify fraction ``f`` is
  ``1 / ((1 - f) t_hit + f t_verify)``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import xxhash

import kvstore
from bench._common import memcpy_seconds, start_daemon, write_result


def interleaved(fns: dict, repeat: int) -> dict[str, float]:
    """Median seconds of each function, the calls interleaved round by round (noise hits all alike)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()   # warm-up
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def wait_sums(client: kvstore.Client) -> None:
    while client.stats()["integrity"]["sums_pending"]:
        time.sleep(0.0005)


def bench_get(client: kvstore.Client, chunk: int, n: int, repeat: int) -> dict:
    keys = client.chunk_keys(list(range(n * 256)))
    payloads = [np.random.randint(0, 255, chunk, dtype=np.uint8) for _ in keys]
    client.put(keys, payloads)
    wait_sums(client)
    out = [bytearray(chunk) for _ in keys]

    def get(verify: bool) -> None:
        with client.get(keys, verify=verify) as views:
            assert len(views) == n
            for dst, view in zip(out, views):
                dst[:] = view

    t = interleaved({"plain": lambda: get(False), "verified": lambda: get(True)}, repeat)
    nbytes = n * chunk
    return {"bytes": nbytes, "plain_gbps": nbytes / t["plain"] / 1e9, "verified_gbps": nbytes / t["verified"] / 1e9,
            "verified_over_plain": t["plain"] / t["verified"]}


def bench_scrub(client: kvstore.Client, repeat: int) -> dict:
    stats = client.stats()
    nbytes = stats["tiers"]["host"]["used_bytes"]
    buf = np.random.randint(0, 255, nbytes, dtype=np.uint8)
    t = interleaved({"scrub": lambda: client.scrub(), "xxh3": lambda: xxhash.xxh3_64_intdigest(buf)}, repeat)
    checked = client.scrub()["bytes"]
    memcpy = memcpy_seconds(nbytes, repeat)
    return {"bytes": checked, "scrub_gbps": checked / t["scrub"] / 1e9, "xxh3_gbps": nbytes / t["xxh3"] / 1e9,
            "memcpy_gbps": nbytes / memcpy / 1e9, "scrub_over_memcpy": (checked / t["scrub"]) / (nbytes / memcpy)}


STREAM = 4   # puts back to back: the sums of one overlap the next put, as under sustained load


def bench_commit(client: kvstore.Client, chunk: int, n: int, repeat: int) -> dict:
    payloads = [np.random.randint(0, 255, chunk, dtype=np.uint8) for _ in range(n)]
    rounds = iter(range(1, 10_000))

    def keys() -> list[bytes]:
        base = next(rounds) * 10_000_000
        return client.chunk_keys([base + t for t in range(n * 256)])

    def put() -> None:
        for _ in range(STREAM):
            client.put(keys(), payloads)

    def put_and_sum() -> None:
        put()
        wait_sums(client)

    dst, src = bytearray(chunk), payloads[0]

    def copy() -> None:
        dst[:] = memoryview(src)

    def copy_and_hash() -> None:
        dst[:] = memoryview(src)
        xxhash.xxh3_64_intdigest(dst)

    t = interleaved({"put": put, "put_and_sum": put_and_sum}, repeat)
    w = interleaved({"copy": copy, "copy_and_hash": copy_and_hash}, repeat * 4)
    nbytes = STREAM * n * chunk
    return {"bytes": nbytes, "put_gbps": nbytes / t["put"] / 1e9,
            "put_until_summed_gbps": nbytes / t["put_and_sum"] / 1e9,
            "summed_over_put": t["put"] / t["put_and_sum"],
            "writer_copy_gbps": chunk / w["copy"] / 1e9, "writer_copy_and_hash_gbps": chunk / w["copy_and_hash"] / 1e9,
            "writer_hash_adds": w["copy_and_hash"] / w["copy"] - 1}


def bench_engine(address: str, repeat: int) -> dict:
    import torch

    from harness.engines.tiny import prefill, prompt, tiny_llama
    from kvstore.connectors.hf import load_prefix, save_prefix

    torch.set_num_threads(1)
    model = tiny_llama(layers=8, hidden=256, heads=8, kv_heads=4)
    ids = prompt(1600, seed=1)
    with kvstore.connect(address, chunk_tokens=256) as c:
        _, cache = prefill(model, ids)
        save_prefix(c, model, ids, cache)
        wait_sums(c)

        def run(fraction: float) -> None:
            cache, n = load_prefix(c, model, ids, verify_fraction=fraction)
            prefill(model, ids, cache, start=n)

        t = interleaved({"hit": lambda: run(0.0), "verified": lambda: run(1.0),
                         "no_cache": lambda: prefill(model, ids)}, repeat)
        mismatches = c.stats()["verify"]["mismatches"]
    per = {f: 1 / ((1 - f) * t["hit"] + f * t["verified"]) for f in (0.0, 0.01, 0.1, 1.0)}
    return {"prompt_tokens": 1600, "cached_tokens": 1536, "hit_s": t["hit"], "verified_s": t["verified"],
            "no_cache_s": t["no_cache"], "mismatches": mismatches,
            "throughput_over_f0": {str(f): per[f] / per[0.0] for f in per}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-mib", type=float, default=4)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--skip-engine", action="store_true")
    args = ap.parse_args()
    chunk = int(args.chunk_mib * (1 << 20))
    d = start_daemon("--host-mem", "512MiB", "--disk-size", "0", "--max-chunk", "64MiB", tcp=False)
    try:
        with kvstore.connect(d.ipc, namespace="bench-verify") as c:
            result = {"chunk_bytes": chunk, "chunks": args.chunks, "repeat": args.repeat,
                      "get": bench_get(c, chunk, args.chunks, args.repeat),
                      "commit": bench_commit(c, chunk, args.chunks, args.repeat)}
            result["scrub"] = bench_scrub(c, max(3, args.repeat // 2))
            c.clear()
        if not args.skip_engine:
            result["engine"] = bench_engine(d.ipc, args.repeat)
    finally:
        d.stop()
    path = write_result("verify", result)
    import json
    print(json.dumps(result, indent=2))
    print("wrote", path)


if __name__ == "__main__":
    main()
