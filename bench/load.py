"""Load: many client processes mixing lookup, get (verified), release and put over ipc:// and tcp:// at once.

    python -m bench.load [--processes 32] [--seconds 180] [--host-mem 256MiB]

Half the processes use ipc:// (shared-memory arena), half tcp:// (bytes in frames). Each behaves like an
engine serving prompts that share prefixes (see harness/workload.py): every chunk read is checked against the
bytes derived from its key. Reports requests/s and MB/s per transport, errors, corrupt chunks and the daemon's
anonymous (heap) memory over time; writes bench/results/load-latest.json.
"""

from __future__ import annotations

import argparse
import json
import sys

from bench._common import free_port, write_result
from harness.daemons import DaemonProc, short_tempdir
from harness.workload import run_load


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=32)
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--host-mem", default="256MiB")
    p.add_argument("--max-chunks", type=int, default=8, help="chunks per prompt (at most)")
    a = p.parse_args()
    port = free_port()
    d = DaemonProc(short_tempdir(), ["--host-mem", a.host_mem, "--tcp", f"127.0.0.1:{port}",
                                     "--log-level", "warning"]).start()
    try:
        addresses = [d.address if i % 2 == 0 else f"tcp://127.0.0.1:{port}" for i in range(a.processes)]
        report = run_load(addresses, a.seconds, d.proc.pid, sample_every=2.0, timeout=30,
                          max_chunks=a.max_chunks)
        with d.client(namespace="bench-check", use_arena=False) as c:
            report["daemon_stats"] = c.stats()
    finally:
        d.stop()
    report["host_mem"] = a.host_mem
    path = write_result("load", report)
    summary = {k: v for k, v in report.items() if k not in ("daemon_rss_anon_bytes", "daemon_stats")}
    print(json.dumps(summary, indent=2))
    print("wrote", path)
    t = report["total"]
    return 0 if t["errors"] == 0 and t["corrupt"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
