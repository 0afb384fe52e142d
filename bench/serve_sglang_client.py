"""SGLang's benchmark client, `python -m sglang.bench_serving`, run once per line of stdin in one process.

    <SGLang venv>/bin/python bench/serve_sglang_client.py    # then a JSON object a line: {"argv": [...], "log": PATH}

Each line runs the client's own command-line entry (``cli_main`` of ``sglang.bench_serving``) with ``argv`` as
its arguments, exactly as ``python -m sglang.bench_serving ARGV`` would, its output going to ``log``; then this
process writes ``done STATUS`` on its own stdout. What it saves is the client's start: importing it (torch,
transformers, datasets) took longer than a whole replay on the shared 2-core machine the benchmark runs on.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings


def run(argv: list[str], log: str) -> int:
    from sglang.bench_serving import cli_main

    saved = os.dup(1), os.dup(2)
    with open(log, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        sys.argv = ["sglang.bench_serving", *argv]
        try:
            cli_main()
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:   # noqa: BLE001 - reported in the log, the next line still runs
            traceback.print_exc()
            status = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
    return status


def main() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # sglang.bench_serving: the module's new name
        import sglang.bench_serving  # noqa: F401
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip():
            job = json.loads(line)
            print(f"done {run(job['argv'], job['log'])}", flush=True)


if __name__ == "__main__":
    main()
