"""A long run of the wire-protocol fuzzer (tests/protocol/test_fuzz.py) against a live daemon.

    python -m bench.fuzz [--examples 5000]

Runs every fuzz property with ``--examples`` examples each (the test suite runs 400) and reports the inputs
sent, the error and ok replies, the wall time and whether every property held. Writes
bench/results/fuzz-latest.json.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time

from bench._common import write_result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=5000)
    a = p.parse_args()
    env = {**os.environ, "KVSTORE_FUZZ_EXAMPLES": str(a.examples)}
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                          os.path.join(ROOT, "tests", "protocol", "test_fuzz.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    wall = time.monotonic() - t0
    stats = {}
    for line in run.stdout.splitlines():
        if "fuzz: {" in line:
            stats = ast.literal_eval(line[line.index("{"):])
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    report = {"examples_per_property": a.examples, "passed": run.returncode == 0, "pytest": summary,
              "wall_s": round(wall, 1), **stats}
    if run.returncode != 0:
        report["failure_tail"] = run.stdout[-4000:]
    path = write_result("fuzz", report)
    print(json.dumps(report, indent=2))
    print("wrote", path)
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
