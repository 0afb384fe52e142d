"""Real SGLang engines, for the tests and the benchmarks: find the engine's virtualenv, start a server, talk to it
over HTTP.

The server (``python -m sglang.launch_server``, SGLang's CPU path) runs in the virtualenv that
``.ci/install-sglang-engine.sh`` makes (default ``${XDG_CACHE_HOME:-~/.cache}/kvstore-dev/venv-sglang``;
``KVSTORE_SGLANG_VENV`` points elsewhere), with ``PYTHONPATH`` at ``sglang_cpu_shim/`` (the CPU kernels the
engine path misses) and the repository root (the backend under test is the source tree's). It runs in a
directory of its own: a folder named ``kvstore`` in the working directory would shadow the package. The random
model is saved by ``scripts/sglang_model.py``; the tests' fixtures are in
``tests/support/engines/sglang_fixtures.py``.
"""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from . import venv
from .sandbox import engine_home_env, shm_files_of
from .venv import venv_dir

REPO = Path(__file__).resolve().parents[2]
SHIM = Path(__file__).resolve().parent / "sglang_cpu_shim"
MODEL_SCRIPT = Path(__file__).resolve().parent / "scripts" / "sglang_model.py"
START_TIMEOUT_S = 600.0
PAGE = 16            # HiCache page size in the tests: one kvstore chunk per page
VOCAB = 512
LOGPROB_TOL = 1e-3
# SGLang's CPU path: the torch-native attention backend, no CUDA graphs, no overlap scheduler; HiCache's
# `direct` I/O backend (the only one with a CPU path). A small KV pool: the default sizes it from free memory.
BASE_FLAGS = [
    "--device", "cpu", "--dtype", "float32", "--attention-backend", "torch_native", "--disable-overlap-schedule",
    "--cuda-graph-backend-decode=disabled", "--cuda-graph-backend-prefill=disabled", "--page-size", str(PAGE),
    "--skip-tokenizer-init", "--max-total-tokens", "8192", "--max-running-requests", "8", "--random-seed", "0",
    # an idle scheduler waits on its sockets instead of polling them: otherwise each server alive keeps one of a
    # small machine's cores busy, and every other engine a test runs starts and serves slower
    "--sleep-on-idle",
]


def venv_path() -> Path:
    """The SGLang engine's virtualenv (``KVSTORE_SGLANG_VENV``, else under the user's own cache folder)."""
    return venv_dir(engine="sglang")


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    """`n` random prompts of `length` token ids (no special tokens), different for every seed."""
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(length)] for _ in range(n)]


def assert_same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """The same greedy tokens, and every log-probability within float32 rounding of the reference."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g["tokens"] == w["tokens"], f"prompt {i}: tokens differ"
        worst = max(abs(a - b) for a, b in zip(g["logprobs"], w["logprobs"]))
        assert worst <= LOGPROB_TOL, f"prompt {i}: log-probabilities differ by {worst}"


def save_model(python: str, directory: str, family: str, env: dict[str, str]) -> str:
    """A random-weight model of `family` with its word-level tokenizer (``sglang_model.py``), in `directory`."""
    subprocess.run([python, str(MODEL_SCRIPT), directory, family], check=True, env=env, cwd=os.path.dirname(directory),
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def backend_config(address: str, **extra: Any) -> dict[str, Any]:
    """``--hicache-storage-backend-extra-config`` for the kvstore backend on `address`."""
    return {"backend_name": "kvstore", "module_path": "kvstore.connectors.sglang",
            "class_name": "KVStoreHiCacheStorage", "interface_v1": 1, "address": address, "timeout": 2.0,
            "retry_s": 0.5, **extra}


def hicache_flags(address: str, layout: str = "layer_first", **extra: Any) -> list[str]:
    """HiCache with the kvstore backend: host pool in `layout` at SGLang's default ratio to the device pool, given
    explicitly (left to itself SGLang sizes the pool from free memory and refuses to start with under 10 GiB free,
    as on a machine other engines share), pages moved by the `direct` I/O backend.

    Prefetches run to completion (``wait_complete``): under SGLang's default ``timeout`` policy a request is
    scheduled once a deadline of about a second passes, with whatever pages arrived by then, so on a loaded
    machine the number of tokens loaded from storage (which the tests and benches count) is left to chance."""
    return ["--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-io-backend", "direct",
            "--hicache-mem-layout", layout, "--hicache-storage-prefetch-policy", "wait_complete",
            "--hicache-storage-backend", "dynamic",
            "--hicache-storage-backend-extra-config", json.dumps(backend_config(address, **extra))]


class EngineError(RuntimeError):
    pass


class SGLangServer:
    """One ``sglang.launch_server`` process (and its scheduler and detokenizer children) on a local port."""

    def __init__(self, python: str, model: str, flags: list[str], workdir: str, name: str,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log_path = os.path.join(workdir, f"sglang-{name}.log")
        rundir = os.path.join(workdir, f"run-{name}")
        os.makedirs(rundir, exist_ok=True)
        env = {**engine_env(workdir), **(env or {})}
        command = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
                   "--port", str(self.port), *BASE_FLAGS, *flags]
        self._log = open(self.log_path, "ab")
        before = set(glob.glob(LOAD_SNAPSHOT_GLOB))
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=rundir,
                                     start_new_session=True)
        self._wait_ready()
        # SGLang's load-snapshot file (its name is random) is made during start and survives the SIGKILL that
        # ends SGLang's processes: the one that appeared while this server started is its own
        self.own_shm = set(glob.glob(LOAD_SNAPSHOT_GLOB)) - before

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(f"SGLang exited with {self.proc.returncode} at start:\n{self.log_tail()}")
            try:
                self._get("/health", timeout=5)
                return
            except (OSError, urllib.error.URLError):
                time.sleep(1.0)
        self.close()
        raise EngineError(f"SGLang not ready after {START_TIMEOUT_S}s:\n{self.log_tail()}")

    def _get(self, path: str, timeout: float = 30.0) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as r:
            return bytes(r.read())

    def _post(self, path: str, body: dict[str, Any], timeout: float = 300.0) -> Any:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                data = r.read()
        except urllib.error.HTTPError as exc:
            raise EngineError(f"{path}: HTTP {exc.code}: {exc.read()[:2000]!r}\n{self.log_tail()}") from exc
        return json.loads(data) if data else None

    def generate(self, batch: list[list[int]], max_tokens: int = 6, **request: Any) -> list[dict[str, Any]]:
        """Greedy outputs of a batch: tokens, their log-probabilities, and where the prompt's KV came from.

        `request`: further fields of SGLang's generate request (``cache_salt``, ``extra_key``).
        """
        body = {"input_ids": batch, "return_logprob": True, **request,
                "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}}
        replies = self._post("/generate", body)
        out = []
        for reply in replies:
            meta = reply["meta_info"]
            if meta.get("finish_reason", {}).get("type") == "abort":
                raise EngineError(f"request aborted: {meta['finish_reason']}\n{self.log_tail()}")
            out.append({"tokens": reply["output_ids"], "logprobs": [lp[0] for lp in meta["output_token_logprobs"]],
                        "cached": int(meta.get("cached_tokens") or 0),
                        "from_storage": storage_tokens(meta.get("cached_tokens_details"))})
        return out

    def update_weights_from_disk(self, model_path: str, **fields: Any) -> None:
        """SGLang's in-place weight update from a checkpoint directory (it flushes the caches after it);
        `fields`: further fields of the request (``weight_version``)."""
        reply = self._post("/update_weights_from_disk", {"model_path": model_path, **fields})
        if not reply.get("success"):
            raise EngineError(f"/update_weights_from_disk: {reply}\n{self.log_tail()}")

    def flush_cache(self, timeout: float = 120.0) -> None:
        """Drop SGLang's own device and host caches (what storage holds stays).

        SGLang refuses a flush (HTTP 400) while requests or HiCache transfers are still in flight: retried
        until it is idle.
        """
        deadline = time.monotonic() + timeout
        while True:
            request = urllib.request.Request(f"http://127.0.0.1:{self.port}/flush_cache", data=b"", method="POST")
            try:
                with urllib.request.urlopen(request, timeout=60) as r:
                    r.read()
                return
            except urllib.error.HTTPError as exc:
                if exc.code != 400 or time.monotonic() > deadline:
                    detail = exc.read()[:500]
                    raise EngineError(f"/flush_cache: HTTP {exc.code}: {detail!r}\n{self.log_tail()}") from exc
            time.sleep(0.5)

    def log_tail(self, n: int = 80) -> str:
        try:
            lines = Path(self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(line[:500] for line in lines[-n:])

    def close(self) -> None:
        """Stop the server and its children (its own process group), and remove the shared-memory files they
        had mapped and left behind (SGLang's processes end by SIGKILL, which skips their own unlinking)."""
        leftovers = shm_files_of_group(self.proc.pid) | getattr(self, "own_shm", set())
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # children left behind by a server that exited first
        except (ProcessLookupError, PermissionError):
            pass
        self._wait_group_gone()
        for path in leftovers:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._log.close()

    def _wait_group_gone(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while group_members(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


LOAD_SNAPSHOT_GLOB = "/dev/shm/sglang_loads_*.shm"
# What SGLang's processes make in /dev/shm: multiprocessing's semaphores and SGLang's own segments (never the
# daemon's arena, which the backend in the scheduler maps too)
ENGINE_SHM_PREFIXES = ("sem.mp-", "sglang_", "sgl_shm_", "multi_tokenizer_args_")


def shm_files_of_group(pgid: int) -> set[str]:
    """The engine's own /dev/shm files that the processes of group `pgid` have mapped."""
    return shm_files_of(group_members(pgid), ENGINE_SHM_PREFIXES)


def storage_tokens(details: Any) -> int:
    """Prompt tokens whose KV came from the storage backend (SGLang's ``cached_tokens_details``)."""
    if not isinstance(details, dict):
        return 0
    value = details.get("storage", 0)
    if isinstance(value, dict):
        value = value.get("tokens", value.get("cached_tokens", 0))
    return int(value or 0)


def engine_env(workdir: str) -> dict[str, str]:
    """The server's environment: SGLang's CPU engine with the shim, the source tree's kvstore, and HOME, the XDG
    dirs and TMPDIR under `workdir` (whatever SGLang, torch or triton leave behind goes with it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHON"))}
    env.update(engine_home_env(workdir), SGLANG_USE_CPU_ENGINE="1", PYTHONPATH=f"{SHIM}{os.pathsep}{REPO}",
               # the test model families only (SGLang imports every model module it ships otherwise), and the
               # page hash extension the installer built
               SGLANG_EXTERNAL_MODEL_PACKAGE="kvstore_test_models",
               TORCH_EXTENSIONS_DIR=str(venv_path() / "torch-extensions"),
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def stored(daemon: Any) -> int:
    """Chunks the daemon holds."""
    with daemon.client() as c:
        return int(c.stats()["chunks"])


def saved_pages(batch: list[list[int]]) -> int:
    """The pages HiCache writes through to storage of these prompts: every whole page of each prompt."""
    return sum(len(p) // PAGE for p in batch)


class Engines:
    """A test module's one engine at a time (`current`), with the kvstore backend on `address`; `restart`
    replaces it by a fresh process with the same model and flags."""

    def __init__(self, python: str, model: str, workdir: str, flags: list[str]) -> None:
        self.python, self.model, self.workdir, self.flags = python, model, workdir, flags
        self.count = 0
        self.current = self._start()

    def _start(self) -> SGLangServer:
        self.count += 1
        return SGLangServer(self.python, self.model, self.flags, self.workdir, f"e{self.count}")

    def restart(self) -> SGLangServer:
        self.current.close()
        self.current = self._start()
        return self.current

    def close(self) -> None:
        self.current.close()


def engine_python() -> str | None:
    """The SGLang engine virtualenv's python, or None (``venv.engine_python``)."""
    return venv.engine_python("sglang")


def skip_reason() -> str:
    return venv.skip_reason("sglang")


def require_engine() -> str:
    """The SGLang engine virtualenv's python; else skip the test (fail it under CI)."""
    return venv.require_engine("sglang")
