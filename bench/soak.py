"""Soak: kill -9 the daemon at random moments under heavy puts and reads, restart it, many times in a row.

    python -m bench.soak [--crashes 30] [--workers 4] [--host-mem 32MiB] [--disk-dir DIR]

Workers (harness/workload.py) put chunks whose bytes derive from their keys, read and verify what they find,
and log every acknowledged put. Between crashes the daemon is killed with SIGKILL at a random moment and
restarted on the same socket; right after each restart the chunks acknowledged before the crash are read back
with a fresh client: each is recovered (exact bytes), lost (missing) or corrupt (wrong bytes: must never
happen). A host-only daemon loses everything by design; with a persistent tier (``--disk-dir``, once the
daemon has one) the recovered count is what its persistence guarantee kept. Writes bench/results/soak-latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict

from bench._common import write_result
from harness.daemons import DaemonProc, short_tempdir
from harness.crashes import acked_keys, read_back
from harness.workload import parse_counts, total, worker_command


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--crashes", type=int, default=30)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--host-mem", default="32MiB")
    p.add_argument("--disk-dir", default=None, help="give the daemon a persistent tier here (if it has one)")
    p.add_argument("--check", type=int, default=2000, help="acknowledged chunks read back after each crash")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng = random.Random(a.seed)
    gaps = [rng.uniform(0.3, 2.5) for _ in range(a.crashes)]
    workdir = short_tempdir()
    args = ["--host-mem", a.host_mem, "--log-level", "warning"]
    if a.disk_dir:
        args += ["--disk-dir", a.disk_dir]
    d = DaemonProc(workdir, args).start()
    acked = [os.path.join(workdir, f"acked{i}") for i in range(a.workers)]
    seconds = sum(gaps) + 1.2 * a.crashes + 3  # the restarts and read-backs take time too
    workers = [subprocess.Popen(worker_command(d.address, seconds, seed=i, tolerate_outage=True,
                                               acked_path=acked[i], timeout=1, max_chunks=12),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(a.workers)]
    crashes = []
    try:
        for gap in gaps:
            time.sleep(gap)
            before = acked_keys(acked)
            d.stop(signal.SIGKILL)
            t0 = time.monotonic()
            d.start()
            restart_s = time.monotonic() - t0
            sample = before[-a.check:]
            correct, corrupt, missing = read_back(d.address, sample)
            crashes.append({"acked_before": len(before), "checked": len(sample), "recovered": correct,
                            "lost": missing, "corrupt": corrupt, "restart_s": round(restart_s, 3)})
            print(json.dumps(crashes[-1]), flush=True)
        results = []
        for w in workers:
            out, err = w.communicate(timeout=seconds + 120)
            results.append(parse_counts(out) if out.strip() else None)
            if err.strip():
                print(err[-1000:], file=sys.stderr)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        d.stop()
    counts = total([r for r in results if r is not None])
    report = {
        "crashes": len(crashes), "workers": a.workers, "host_mem": a.host_mem, "persistent": bool(a.disk_dir),
        "per_crash": crashes,
        "chunks_checked": sum(c["checked"] for c in crashes),
        "chunks_recovered": sum(c["recovered"] for c in crashes),
        "chunks_lost": sum(c["lost"] for c in crashes),
        "chunks_corrupt": sum(c["corrupt"] for c in crashes) + counts.corrupt,
        "median_restart_s": sorted(c["restart_s"] for c in crashes)[len(crashes) // 2] if crashes else None,
        "workers_total": asdict(counts),
        "workers_finished": sum(r is not None for r in results),
    }
    path = write_result("soak", report)
    print(json.dumps({k: v for k, v in report.items() if k != "per_crash"}, indent=2))
    print("wrote", path)
    return 0 if report["chunks_corrupt"] == 0 and counts.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
