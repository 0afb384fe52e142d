"""`sglang.launch_server` with HiCache and a storage backend, and `sglang.bench_serving`, from SGLang's virtualenv.

The server runs SGLang 0.5.23's CPU path as the engine tests start it (`harness/engines/sglang_real.py`: the
CPU kernels shim on ``PYTHONPATH``, ``SGLANG_USE_CPU_ENGINE=1``, HOME and the temp dir in a scratch directory,
started from a directory with no ``kvstore`` folder in it), but with its tokenizer (the benchmark client sends
text) and HiCache on in every arm; the arms differ only in ``--hicache-storage-backend``:

* ``hicache``: no storage backend (device pool and HiCache's host pool only);
* ``file``: SGLang's ``file`` backend, one file per page in a scratch directory;
* ``mooncake``: SGLang's ``mooncake`` backend on a Mooncake Store (``mooncake_master`` and one
  ``mooncake_client`` storage node holding the objects, `harness/servers.py`); the engine contributes no
  memory of its own (``global_segment_size`` 0), so what it stored outlives it, as kvstore's daemon does;
* ``kvstore``: the kvstore connector as a ``dynamic`` backend, configured as docs/connectors/sglang.md says
  (`backend_config` of the engine tests), keeping its keys across ``/flush_cache`` (``reset_on_flush`` false).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.engines.sglang_real import (
    LOAD_SNAPSHOT_GLOB,
    EngineError,
    SGLangServer,
    backend_config,
    engine_env,
    venv_path,
)

ARMS = ("hicache", "file", "mooncake", "kvstore")
SERVED_NAME = "bench"
SITE = Path(__file__).resolve().parent / "sglang_site"   # what the benchmark adds to the CPU shim (its docstring)


def bench_env(workdir: str) -> dict[str, str]:
    """The engine tests' environment for SGLang (`engine_env`), with the benchmark's `sitecustomize` first."""
    env = engine_env(workdir)
    env["PYTHONPATH"] = f"{SITE}{os.pathsep}{env['PYTHONPATH']}"
    return env


@dataclass(frozen=True)
class Venv:
    """SGLang's virtualenv: its python and the installed sglang version."""

    root: Path
    version: str

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")


def find_venv(root: str | None = None) -> Venv | None:
    """SGLang's virtualenv at `root` (default: where the engine tests find it) if it has sglang, else None."""
    path = Path(root) if root else venv_path()
    infos = sorted(path.glob("lib/python*/site-packages/sglang-*.dist-info"))
    if not (path / "bin" / "python").exists() or not infos:
        return None
    return Venv(path, infos[-1].name[len("sglang-"):-len(".dist-info")])


def mooncake_binaries(venv: Venv) -> tuple[str, str] | None:
    """`mooncake_master` and `mooncake_client` of the Mooncake package in SGLang's virtualenv (the one its
    `mooncake` backend imports), or None when it is not installed there."""
    for folder in venv.root.glob("lib/python*/site-packages/mooncake"):
        master, node = folder / "mooncake_master", folder / "mooncake_client"
        if os.access(master, os.X_OK) and os.access(node, os.X_OK) and list(folder.glob("store*.so")):
            return str(master), str(node)
    return None


@dataclass(frozen=True)
class EngineShape:
    """What every arm's server shares: the paged KV pool, HiCache's host pool, the batch limits."""

    page: int
    pool_tokens: int
    hicache_ratio: float
    max_running: int


def base_flags(shape: EngineShape) -> list[str]:
    """SGLang's CPU path (as in the engine tests) with HiCache's host pool in `layer_first`, moved by `direct`."""
    return ["--device", "cpu", "--dtype", "float32", "--attention-backend", "torch_native",
            "--disable-overlap-schedule", "--cuda-graph-backend-decode=disabled",
            "--cuda-graph-backend-prefill=disabled", "--page-size", str(shape.page),
            "--max-total-tokens", str(shape.pool_tokens), "--max-running-requests", str(shape.max_running),
            "--random-seed", "0", "--served-model-name", SERVED_NAME, "--enable-cache-report",
            "--log-level", "warning",
            "--enable-hierarchical-cache", "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first",
            "--hicache-ratio", f"{shape.hicache_ratio:g}"]


def storage_flags(arm: str, store: Any) -> list[str]:
    """The storage backend flags of `arm` (`store`: the file directory, the Mooncake cluster, the daemon)."""
    if arm == "hicache":
        return []
    if arm == "file":
        config: dict[str, Any] = {"file_storage_path": store}
        return ["--hicache-storage-backend", "file", "--hicache-storage-backend-extra-config", json.dumps(config)]
    if arm == "mooncake":
        config = {"master_server_address": store.master_address, "metadata_server": store.metadata,
                  "protocol": "tcp", "device_name": "", "local_hostname": "127.0.0.1", "global_segment_size": 0}
        return ["--hicache-storage-backend", "mooncake", "--hicache-storage-backend-extra-config",
                json.dumps(config)]
    if arm == "kvstore":
        # `reset_on_flush` false: the benchmark's restart and cold starts are `/flush_cache` calls, and under the
        # default a flush moves the model's epoch (every page saved before is a miss after), as a flush that
        # stands for new weights must; a real restart (`--real-restart`) keeps the keys either way
        return ["--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config",
                json.dumps(backend_config(store, reset_on_flush=False))]
    raise ValueError(f"unknown arm {arm!r}: choose from {', '.join(ARMS)}")


class Server(SGLangServer):
    """One `sglang.launch_server` of the benchmark (the engine tests' server, with its tokenizer and our flags)."""

    def __init__(self, python: str, model: str, flags: list[str], workdir: str, name: str) -> None:
        import glob

        from harness.engines.sglang_real import free_port

        self.port = free_port()
        self.name = name
        self.log_path = os.path.join(workdir, f"sglang-{name}.log")
        rundir = os.path.join(workdir, f"run-{name}")
        os.makedirs(rundir, exist_ok=True)
        command = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
                   "--port", str(self.port), *flags]
        self._log = open(self.log_path, "ab")
        before = set(glob.glob(LOAD_SNAPSHOT_GLOB))
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=bench_env(workdir),
                                     cwd=rundir, start_new_session=True)
        self._wait_ready()
        self.own_shm = set(glob.glob(LOAD_SNAPSHOT_GLOB)) - before

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pause(self) -> None:
        """Stop the server's processes (SIGSTOP to its group): an idle SGLang scheduler polls its queues and
        takes a fifth of a core, which an arm being measured would share with every idle one."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        self.resume()
        super().close()

    def clear_storage(self) -> None:
        """SGLang's own `clear` of its storage backend (the file backend deletes its files, Mooncake removes
        every object)."""
        request = urllib.request.Request(self.url + "/hicache/storage-backend/clear", data=b"", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                r.read()
        except urllib.error.HTTPError as exc:
            raise EngineError(f"/hicache/storage-backend/clear: HTTP {exc.code}\n{self.log_tail()}") from exc


def client_argv(url: str, model: str, trace: str, num: int, concurrency: int, out: str) -> list[str]:
    """The arguments of `python -m sglang.bench_serving` for a Mooncake-format trace (its ``mooncake`` dataset: a
    request per row, sent at the row's timestamp, its prompt written from the row's hash ids), at most
    `concurrency` in flight, the result and its cache report appended to `out`."""
    return ["--backend", "sglang", "--base-url", url, "--model", model, "--tokenizer", model,
            "--dataset-name", "mooncake", "--dataset-path", trace, "--mooncake-workload", "conversation",
            "--mooncake-num-rounds", "1", "--mooncake-slowdown-factor", "1", "--num-prompts", str(num),
            "--max-concurrency", str(concurrency), "--warmup-requests", "0", "--cache-report", "--seed", "0",
            "--disable-tqdm", "--output-file", out]


class Client:
    """SGLang's benchmark client in one process for the run (`bench/serve_sglang_client.py`): each `run` is one
    `python -m sglang.bench_serving ARGS`, without importing the client again."""

    def __init__(self, venv: Venv, workdir: str) -> None:
        self.workdir = workdir
        rundir = os.path.join(workdir, "client")
        os.makedirs(rundir, exist_ok=True)
        self.proc = subprocess.Popen([venv.python, str(Path(__file__).with_name("serve_sglang_client.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=bench_env(workdir),
                                     cwd=rundir, text=True)

    def wait_ready(self, timeout: float = 600.0) -> None:
        line = self._line(timeout)
        if line != "ready":
            raise RuntimeError(f"sglang.bench_serving did not start: {line!r}")

    def _line(self, timeout: float) -> str:
        import select

        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise RuntimeError(f"sglang.bench_serving: no answer in {timeout:.0f} s")
        return self.proc.stdout.readline().strip()

    def run(self, url: str, model: str, trace: str, num: int, concurrency: int, tag: str,
            timeout: float = 1800.0) -> dict[str, Any]:
        """One replay; the client's result record (with its cache report: prompt tokens from device, host and
        storage)."""
        out, log = os.path.join(self.workdir, f"{tag}.jsonl"), os.path.join(self.workdir, f"{tag}.log")
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"argv": client_argv(url, model, trace, num, concurrency, out),
                                          "log": log}) + "\n")
        self.proc.stdin.flush()
        status = self._line(timeout)
        records = []
        if os.path.exists(out):
            with open(out) as f:
                records = [json.loads(line) for line in f if line.strip()]
        if status != "done 0" or not records:
            tail = Path(log).read_text(errors="replace").strip().splitlines()[-5:] if os.path.exists(log) else []
            raise RuntimeError(f"sglang.bench_serving failed ({status or 'exited'}): {' | '.join(tail)}")
        return records[-1]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


FIELDS = ("completed", "duration", "request_throughput", "input_throughput", "output_throughput",
          "total_throughput", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_e2e_latency_ms",
          "total_input_tokens")


def summarize(record: dict[str, Any], num: int) -> dict[str, Any]:
    """The client's figures of one replay, and where its prompt tokens came from (SGLang's cache report)."""
    out = {k: record.get(k) for k in FIELDS}
    out["failed"] = num - int(record.get("completed") or 0)
    report = record.get("cache_report") or {}
    total = report.get("total_prompt_tokens") or 0
    for source in ("device", "host", "storage"):
        tokens = report.get(f"{source}_cached_tokens") or 0
        out[f"{source}_hit_rate"] = tokens / total if total else None
    out["token_hit_rate"] = (report.get("total_cached_tokens") or 0) / total if total else None
    return out


def wait_until(predicate: Any, timeout: float, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())
