"""How long a clean stop takes: SIGTERM to the process's end, and the daemon's ``stopped`` line to its end.

    python -m bench.stop_time [--repeat 5] [--host-mem SIZE] [--quick] [--out FILE]

For each round a daemon is started with a large arena (by default half the memory available now, at most 8 GiB:
a size whose pages cost time to reserve and free), a client puts and gets 8 chunks and leaves, and the daemon is
sent SIGTERM. Reported per round and as medians and maxima: seconds from SIGTERM to the process's exit, from the
daemon's ``stopping`` line to the exit, and from its ``stopped`` line to the exit (the log lines' own timestamps
against the wall clock at exit). Writes bench/results/stop-time-latest.json (``--quick``: two rounds, a temporary
file) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import statistics
import time

import kvstore
from bench._common import add_output_flag, start_daemon, write_result
from harness.memory import large_host_mem

PHASES = ("sigterm_to_exit_s", "stopping_to_exit_s", "stopped_to_exit_s")


def log_time(log: str, event: str) -> float:
    """The wall-clock time of the daemon's first ``event`` line (its own timestamp)."""
    line = next(line for line in log.splitlines() if f"event={event}" in line)
    return datetime.datetime.strptime(line[3:26], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def one_round(host_mem: str) -> dict[str, float]:
    """Start a daemon, use it once, stop it with SIGTERM; the seconds each phase of the stop took."""
    d = start_daemon("--host-mem", host_mem, "--log-level", "info", tcp=False)
    try:
        with kvstore.connect(d.ipc, namespace="stop", timeout=60) as c:
            keys = [os.urandom(16) for _ in range(8)]
            c.put(keys, [b"s" * 100_000] * 8)
            with c.get(keys):
                pass
        signalled = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        code = d.proc.wait(timeout=120)
        exited_mono, exited = time.monotonic(), time.time()
        log = d.daemon.log()
    finally:
        d.stop()
    if code != 0:
        raise RuntimeError(f"the daemon exited with {code}:\n{log[-2000:]}")
    return {"sigterm_to_exit_s": exited_mono - signalled, "stopping_to_exit_s": exited - log_time(log, "stopping"),
            "stopped_to_exit_s": exited - log_time(log, "stopped")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--host-mem", default=None, help="arena size (default: half the memory available, ≤ 8 GiB)")
    parser.add_argument("--quick", action="store_true", help="two rounds, result to a temporary file")
    add_output_flag(parser)
    args = parser.parse_args()
    host_mem = args.host_mem or large_host_mem()
    rounds = [one_round(host_mem) for _ in range(2 if args.quick else args.repeat)]
    summary = {phase: {"median": round(statistics.median(r[phase] for r in rounds), 4),
                       "max": round(max(r[phase] for r in rounds), 4)} for phase in PHASES}
    path = write_result("stop-time", {"host_mem": host_mem, "rounds": rounds, "summary": summary},
                        quick=args.quick, out=args.out)
    print(f"| phase ({host_mem} arena) | median s | max s |\n|---|---|---|")
    for phase in PHASES:
        print(f"| {phase} | {summary[phase]['median']} | {summary[phase]['max']} |")
    print(f"({path})")


if __name__ == "__main__":
    main()
