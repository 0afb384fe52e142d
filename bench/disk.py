"""Disk tier throughput through the daemon next to raw O_DIRECT on the same directory; index rebuild rate;
promotion latency; what lz4 buys.

    python -m bench.disk [--dir DIR] [--total 512MiB] [--quick]

Write: chunks are put as fast as the client can and the clock stops when the last one is on disk (the write-back
queue is empty). Read: the daemon is restarted (SIGTERM flushes, DRAM starts empty) and every chunk is read back
with gets of 4 chunks, each of which awaits the promotion of its chunks from disk. Raw: one file written and read
sequentially with O_DIRECT in chunk-sized requests, in the same directory, in the same run. Rebuild: the chunks
found per second when a daemon starts on a directory of many small chunk files (the page cache may hold their
headers: a warm restart). Promotion: from a lookup of one disk-only chunk until a lookup reports it in DRAM.
Writes bench/results/disk-latest.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import kvstore
from bench._common import DaemonProc, short_tempdir, write_result

MiB = 1 << 20


def Daemon(workdir: str, *args: str) -> DaemonProc:
    return DaemonProc(workdir, ["--log-level", "info", *args])


def wait_written(c: kvstore.Client) -> None:
    while True:
        stats = c.stats()
        disk, sums = stats["disk"], stats.get("integrity", {}).get("sums_pending", 0)
        if disk["write_queue_chunks"] == 0 and disk["writes_in_flight"] == 0 and sums == 0:
            return
        time.sleep(0.002)


def raw_direct(directory: str, size: int, total: int) -> dict:
    buf = mmap.mmap(-1, size)
    buf.write(np.random.randint(0, 255, size, dtype=np.uint8).tobytes())
    path = os.path.join(directory, "raw-direct.bin")
    n = max(1, total // size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    t0 = time.perf_counter()
    for i in range(n):
        os.pwrite(fd, buf, i * size)
    os.fsync(fd)
    write_s = time.perf_counter() - t0
    os.close(fd)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    t0 = time.perf_counter()
    for i in range(n):
        os.preadv(fd, [buf], i * size)
    read_s = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    return {"write_GBps": n * size / write_s / 1e9, "read_GBps": n * size / read_s / 1e9}


def through_daemon(directory: str, size: int, total: int, host_mem: int) -> dict:
    workdir = short_tempdir()
    disk_dir = os.path.join(directory, f"disk-{size}")
    d = Daemon(workdir, "--host-mem", str(host_mem), "--disk-dir", disk_dir, "--disk-size", str(4 * total))
    d.start()
    n = max(4, total // size)
    payloads = [np.random.randint(0, 255, size, dtype=np.uint8) for _ in range(4)]
    try:
        with kvstore.connect(d.address, namespace=f"disk-bench-{size}", chunk_tokens=16, timeout=60) as c:
            keys = c.chunk_keys(list(range(16 * n)))
            t0 = time.perf_counter()
            for i in range(0, n, 4):
                c.put(keys[i:i + 4], payloads[:len(keys[i:i + 4])], parent=keys[i - 1] if i else None)
            wait_written(c)
            write_s = time.perf_counter() - t0
        d.stop()
        d.start()
        dest = np.empty(size, dtype=np.uint8)
        with kvstore.connect(d.address, namespace=f"disk-bench-{size}", chunk_tokens=16, timeout=60) as c:
            t0 = time.perf_counter()
            got = 0
            for i in range(0, n, 4):
                with c.get(keys[i:i + 4]) as views:
                    for v in views:
                        np.copyto(dest, np.frombuffer(v, dtype=np.uint8))
                    got += len(views)
            read_s = time.perf_counter() - t0
            assert got == n, f"read back {got} of {n} chunks"
        d.stop()
        d.start()  # DRAM empty again
        with kvstore.connect(d.address, namespace=f"disk-bench-{size}", chunk_tokens=16, timeout=60) as c:
            promo = promotion_latency(c, keys, n)
    finally:
        d.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(disk_dir, ignore_errors=True)
    return {"write_GBps": n * size / write_s / 1e9, "read_GBps": n * size / read_s / 1e9,
            "promotion_ms_median": promo, "chunks": n}


def promotion_latency(c: kvstore.Client, keys: list[bytes], n: int) -> float:
    """Median time from a lookup of one disk-only chunk until it is readable from DRAM."""
    samples = []
    for i in range(0, n, max(1, n // 8)):
        if c.lookup_tiers(keys[i:i + 1], promote=False).tiers != {"disk": 1}:
            continue
        t0 = time.perf_counter()
        c.lookup(keys[i:i + 1])
        while c.lookup_tiers(keys[i:i + 1], promote=False).tiers != {"host": 1}:
            pass
        samples.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(samples), 3) if samples else float("nan")


def rebuild_rate(directory: str, count: int) -> dict:
    from kvstore.tiers.disk.tier import DiskTier

    disk_dir = os.path.join(directory, "disk-rebuild")
    tier = DiskTier(disk_dir, 1 << 40)
    slot = memoryview(mmap.mmap(-1, 16384))
    for i in range(count):
        tier.write(i.to_bytes(16, "little"), "bench/rebuild", slot, 16384)
    workdir = short_tempdir()
    d = Daemon(workdir, "--host-mem", "64MiB", "--disk-dir", disk_dir, "--disk-size", "4GiB")
    try:
        d.start()
        line = next(ln for ln in d.log().splitlines() if "disk_index_rebuilt" in ln)
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        return {"chunks": int(fields["chunks"]), "seconds": float(fields["seconds"]),
                "chunks_per_s": int(fields["chunks_per_s"])}
    finally:
        d.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(disk_dir, ignore_errors=True)


def lz4_figures(size: int = 32 * MiB) -> dict:
    import lz4.block
    import torch

    samples = {
        "random": np.random.randint(0, 255, size, dtype=np.uint8).tobytes(),
        # KV-like: bf16 values of a normal distribution (the high byte repeats, the low byte is noise).
        "bf16_normal": torch.randn(size // 2).to(torch.bfloat16).view(torch.uint8).numpy().tobytes(),
    }
    out = {}
    for name, data in samples.items():
        t0 = time.perf_counter()
        packed = lz4.block.compress(data, store_size=False)
        c_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        lz4.block.decompress(packed, uncompressed_size=len(data))
        d_s = time.perf_counter() - t0
        out[name] = {"ratio": round(len(packed) / len(data), 3), "compress_GBps": round(size / c_s / 1e9, 2),
                     "decompress_GBps": round(size / d_s / 1e9, 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp", help="a directory on the disk to measure")
    parser.add_argument("--total", default="512MiB", help="bytes written per chunk size")
    parser.add_argument("--quick", action="store_true", help="smaller totals, for a smoke run")
    args = parser.parse_args()
    from kvstore.units import parse_size

    total = 128 * MiB if args.quick else parse_size(args.total)
    base = tempfile.mkdtemp(prefix="kvdisk-", dir=args.dir)
    results: dict = {"dir": args.dir, "total_bytes": total, "sizes": {}}
    try:
        for label, size in (("2MiB", 2 * MiB), ("32MiB", 32 * MiB)):
            raw = raw_direct(base, size, total)
            daemon = through_daemon(base, size, total, host_mem=max(256 * MiB, 16 * size))
            results["sizes"][label] = {
                "raw": raw, "daemon": daemon,
                "write_ratio": round(daemon["write_GBps"] / raw["write_GBps"], 2),
                "read_ratio": round(daemon["read_GBps"] / raw["read_GBps"], 2),
            }
        results["rebuild"] = rebuild_rate(base, 2000 if args.quick else 10000)
        results["lz4"] = lz4_figures(8 * MiB if args.quick else 32 * MiB)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    path = write_result("disk", results, quick=args.quick)
    print(f"results: {path}\n")
    print("| chunk | raw O_DIRECT write | daemon write | ratio | raw O_DIRECT read | daemon read | ratio | "
          "promotion (median) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, r in results["sizes"].items():
        print(f"| {label} | {r['raw']['write_GBps']:.2f} GB/s | {r['daemon']['write_GBps']:.2f} GB/s | "
              f"{r['write_ratio']}× | {r['raw']['read_GBps']:.2f} GB/s | {r['daemon']['read_GBps']:.2f} GB/s | "
              f"{r['read_ratio']}× | {r['daemon']['promotion_ms_median']} ms |")
    rb = results["rebuild"]
    print(f"\nindex rebuild: {rb['chunks']} chunks in {rb['seconds']} s = {rb['chunks_per_s']} chunks/s")
    for name, z in results["lz4"].items():
        print(f"lz4 on {name}: size ×{z['ratio']}, compress {z['compress_GBps']} GB/s, "
              f"decompress {z['decompress_GBps']} GB/s")


if __name__ == "__main__":
    main()
