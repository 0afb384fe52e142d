"""What the weights fingerprint costs at engine start, against the checkpoint's size.

    python -m bench.fingerprint [--quick] [--size 4GiB] [--repeat 3] [--out FILE]

A synthetic checkpoint of a 7B-shaped model (32 layers of nine tensors each: attention, MLP and two norms, in
float16, scaled to ``--size``; shards of at most 2 GiB, as transformers writes them) is written to a temporary
directory. Its fingerprint (``kvstore.connectors.common.fingerprint``) is then taken in both modes, ``sampled``
(the default: every safetensors header and windows of every tensor) and ``full`` (every byte), each from a
warm page cache (the engine has just read the weights: the usual case at engine start) and from a cold one
(the files' pages dropped first with ``posix_fadvise(DONTNEED)``, which touches these files only). Reported:
the median seconds of ``--repeat`` runs and the bytes each mode reads. The checkpoint is removed afterwards.
Writes bench/results/fingerprint-latest.json (``--quick``: 256 MiB and a temporary file) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._common import add_output_flag, write_result
from kvstore.connectors.common.fingerprint import weights_fingerprint
from kvstore.units import format_size, parse_size

SHARD = 2 << 30
LAYERS = 32
# A 7B model's tensors per layer, in units of hidden*hidden (its MLP is 11008/4096 of hidden wide).
LAYER_TENSORS = (("self_attn.q_proj", 1.0), ("self_attn.k_proj", 1.0), ("self_attn.v_proj", 1.0),
                 ("self_attn.o_proj", 1.0), ("mlp.gate_proj", 2.6875), ("mlp.up_proj", 2.6875),
                 ("mlp.down_proj", 2.6875))


def tensors_of(size: int) -> list[tuple[str, int]]:
    """(name, bytes) of a 7B-shaped float16 checkpoint of about ``size`` bytes."""
    per_layer_units = sum(u for _, u in LAYER_TENSORS)
    unit = size / (LAYERS * per_layer_units)
    hidden = int((unit / 2) ** 0.5) // 64 * 64 or 64
    out = []
    for layer in range(LAYERS):
        for name, units in LAYER_TENSORS:
            out.append((f"model.layers.{layer}.{name}.weight", int(hidden * hidden * units) // 64 * 64 * 2))
        out += [(f"model.layers.{layer}.input_layernorm.weight", hidden * 2),
                (f"model.layers.{layer}.post_attention_layernorm.weight", hidden * 2)]
    return out


def write_checkpoint(directory: Path, size: int, seed: int = 0) -> int:
    """Write the checkpoint's shards (random bytes, streamed); returns the bytes written."""
    rng = np.random.default_rng(seed)
    shards: list[list[tuple[str, int]]] = [[]]
    used = 0
    for name, nbytes in tensors_of(size):
        if used + nbytes > SHARD and shards[-1]:
            shards.append([])
            used = 0
        shards[-1].append((name, nbytes))
        used += nbytes
    total = 0
    for i, shard in enumerate(shards):
        header, offset = {}, 0
        for name, nbytes in shard:
            header[name] = {"dtype": "F16", "shape": [nbytes // 2], "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(directory / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for _, nbytes in shard:
                while nbytes:
                    n = min(nbytes, 64 << 20)
                    f.write(rng.bytes(n))
                    nbytes -= n
            total += f.tell()
    return total


def drop_pages(directory: Path) -> None:
    """Drop these files' pages from the page cache (nothing else's)."""
    for file in directory.iterdir():
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(directory: Path, mode: str, cold: bool, repeat: int) -> dict:
    seconds, read = [], 0
    weights_fingerprint(directory, mode)          # warm: the pages in cache, as after the engine's load
    for _ in range(repeat):
        if cold:
            drop_pages(directory)
        t0 = time.perf_counter()
        found = weights_fingerprint(directory, mode)
        seconds.append(time.perf_counter() - t0)
        read = found.bytes_read
    return {"mode": mode, "cache": "cold" if cold else "warm", "seconds_p50": statistics.median(seconds),
            "seconds": seconds, "bytes_read": read}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 256 MiB checkpoint, one run, a temporary file")
    parser.add_argument("--size", default="4GiB", help="the checkpoint's size (default 4GiB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temporary dir)")
    add_output_flag(parser)
    args = parser.parse_args()
    size = parse_size("256MiB" if args.quick else args.size)
    repeat = 1 if args.quick else args.repeat
    directory = Path(tempfile.mkdtemp(prefix="kvstore-fingerprint-", dir=args.dir))
    try:
        written = write_checkpoint(directory, size)
        rows = [timed(directory, mode, cold, repeat) for mode in ("sampled", "full") for cold in (False, True)]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    files = len(list(tensors_of(size)))
    path = write_result("fingerprint", {"checkpoint_bytes": written, "tensors": files, "repeat": repeat,
                                        "rows": rows}, quick=args.quick, out=args.out)
    print(f"checkpoint {format_size(written)}, {files} tensors\n")
    print("| mode | page cache | p50 s | bytes read |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['mode']} | {r['cache']} | {r['seconds_p50']:.3f} | {format_size(r['bytes_read'])} |")
    print(f"\n{path}")


if __name__ == "__main__":
    main()
