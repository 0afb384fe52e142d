"""A batch of chunks copied into a shared arena, as a client's put does: one thread, two threads
(``kvstore/client/copies.py``: a batch of ``PARALLEL_FROM`` bytes or more is cut in two halves), and a plain
memcpy of the same bytes in one call, the physical reference, in the same run.

    python -m bench.copies [--quick] [--repeat N] [--out PATH]

The destination is a fresh anonymous shared mapping (as the arena is: memory not in cache, read before it is
written), touched once before timing. For each batch size, rounds interleave the two ways (each first in turn)
and the medians are reported with their ratio to memcpy. Writes bench/results/copies-latest.json
(``--quick``: a temporary file).
"""

from __future__ import annotations

import argparse
import mmap
import sys
import time

import numpy as np

from bench._common import add_output_flag, machine, memcpy_seconds, write_result
from kvstore.client import copies
from kvstore.client.buffers import copy_into

CHUNK = 2 << 20                                  # a 256-token chunk of a small model's KV
BATCHES = (1, 2, 4, 8, 16, 32)                    # chunks per batch


def _one_thread(pairs: list[tuple[memoryview, np.ndarray]], sizes: list[int]) -> None:
    for dst, src in pairs:
        copy_into(dst, src)


def _batch(arena: memoryview, payloads: list[np.ndarray]) -> list[tuple[memoryview, np.ndarray]]:
    return [(arena[i * CHUNK:(i + 1) * CHUNK], p) for i, p in enumerate(payloads)]


def measure(chunks: int, repeat: int) -> dict[str, float]:
    """Median seconds of the two ways for one batch size, and memcpy's."""
    arena_map = mmap.mmap(-1, chunks * CHUNK)
    arena = memoryview(arena_map)
    arena[:] = b"\1" * len(arena)
    payloads = [np.random.default_rng(i).integers(0, 255, CHUNK, dtype=np.uint8) for i in range(chunks)]
    pairs, sizes = _batch(arena, payloads), [CHUNK] * chunks
    ways = {"one_thread": lambda: _one_thread(pairs, sizes),
            "copy_batch": lambda: copies.copy_batch(copy_into, pairs, sizes)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(repeat):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for name in order:
            start = time.perf_counter()
            ways[name]()
            times[name].append(time.perf_counter() - start)
    for dst, src in pairs:
        assert bytes(dst[:64]) == src[:64].tobytes()
    result = {name: float(np.median(t)) for name, t in times.items()}
    result["memcpy"] = memcpy_seconds(chunks * CHUNK, repeat)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two batch sizes, five rounds")
    parser.add_argument("--repeat", type=int, default=21, help="interleaved rounds per batch size")
    add_output_flag(parser)
    args = parser.parse_args(argv)
    batches = (2, 8) if args.quick else BATCHES
    repeat = 5 if args.quick else args.repeat
    rows = []
    for chunks in batches:
        got = measure(chunks, repeat)
        nbytes = chunks * CHUNK
        rows.append({"chunks": chunks, "bytes": nbytes, "parallel": nbytes >= copies.PARALLEL_FROM and chunks >= 2,
                     **{f"{k}_s": v for k, v in got.items()},
                     "copy_batch_over_one_thread": got["copy_batch"] / got["one_thread"],
                     "memcpy_over_copy_batch": got["memcpy"] / got["copy_batch"]})
        print(f"{chunks:3d} chunks {nbytes >> 20:4d} MiB  one thread {got['one_thread'] * 1e3:7.2f} ms  "
              f"copy_batch {got['copy_batch'] * 1e3:7.2f} ms  memcpy {got['memcpy'] * 1e3:7.2f} ms")
    result = {"machine": machine(), "chunk_bytes": CHUNK, "repeat": repeat, "parallel_from": copies.PARALLEL_FROM,
              "rows": rows}
    path = write_result("copies", result, args.quick, args.out)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
