"""Real vLLM engines, for the tests and the benchmarks: find the engine's virtualenv, start engines, talk to them.

An engine process (``scripts/vllm_engine.py``) runs in the virtualenv that ``.ci/install-vllm-engine.sh`` makes
(outside the checkout: ``venv.py`` says where; ``KVSTORE_VLLM_VENV`` points elsewhere) with ``PYTHONPATH`` at the
repository root, so the connector under test is the source tree's. Engines are started once per configuration and
kept in ``POOL`` for the whole session; each test brings its own daemon on the one socket path every engine is
configured with (``POOL.socket``), so the connector meets a fresh daemon per test, exactly as after a restart. The
tests' fixtures over ``POOL`` are in ``tests/support/engines/vllm_fixtures.py``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from . import venv
from .sandbox import descendants, engine_home_env, remove_files, shm_files_of

REPO = Path(__file__).resolve().parents[2]
ENGINE_SCRIPT = Path(__file__).resolve().parent / "scripts" / "vllm_engine.py"
START_TIMEOUT_S = 600.0
# What vLLM's processes make in /dev/shm: multiprocessing's semaphores and shared memory (never the daemon's arena)
ENGINE_SHM_PREFIXES = ("sem.mp-", "psm_", "vllm")
CHUNK = 256        # connector chunk size in the tests: two of the CPU engine's 128-token blocks
VOCAB = 512


def prompts(n: int, length: int, seed: int, prefix: list[int] | None = None) -> list[list[int]]:
    """`n` random prompts of `length` tokens (after `prefix`), different for every seed."""
    rng = random.Random(seed)
    head = list(prefix or [])
    return [head + [rng.randrange(3, VOCAB) for _ in range(length - len(head))] for _ in range(n)]


LOGPROB_TOL = 1e-3


def assert_same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """The same greedy tokens, and log-probabilities equal to float32 rounding across batch shapes."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g["tokens"] == w["tokens"], f"prompt {i}: tokens differ"
        assert len(g["logprobs"]) == len(w["logprobs"])
        worst = max(abs(a - b) for a, b in zip(g["logprobs"], w["logprobs"]))
        assert worst <= LOGPROB_TOL, f"prompt {i}: log-probabilities differ by {worst}"


def plain(pool: "EnginePool") -> "EngineProc":
    """The reference: an engine with no connector and no prefix caching (every prompt prefilled in full)."""
    return pool.get("plain", prefix_caching=False)


def stored(daemon: Any) -> int:
    """Chunks the daemon holds."""
    with daemon.client() as c:
        return int(c.stats()["chunks"])


def delta(after: dict[str, Any], before: dict[str, Any], side: str, name: str) -> int:
    """How much a connector counter (`stats()`) grew."""
    return after.get(side, {}).get(name, 0) - before.get(side, {}).get(name, 0)


def full_chunks(batch: list[list[int]]) -> int:
    """The chunks the connector stores of these prompts (never the one holding a prompt's last token)."""
    return sum((len(p) - 1) // CHUNK for p in batch)


class EngineError(RuntimeError):
    pass


class EngineProc:
    """One engine process and its JSON-lines conversation."""

    def __init__(self, python: str, config: dict[str, Any], log_path: str, env: dict[str, str]) -> None:
        self.config = config
        self.log_path = log_path
        self.namespace = ""   # the connector's session namespace and key scheme, learnt with its chunk keys
        self.key_scheme = ""
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [python, str(ENGINE_SCRIPT), "serve", json.dumps(config)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, env=env, cwd=str(REPO), text=True, bufsize=1,
        )
        self._lock = threading.Lock()
        ready = self._read(START_TIMEOUT_S)
        if not ready.get("ready"):
            raise EngineError(f"engine did not start: {ready}\n{self.log_tail()}")

    def _read(self, timeout: float) -> dict[str, Any]:
        stdout = self.proc.stdout
        assert stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not result or not result[0]:
            self.close()
            raise EngineError(f"engine gave no reply (exit code {self.proc.poll()}):\n{self.log_tail()}")
        return json.loads(result[0])

    def call(self, op: str, timeout: float = 300.0, **args: Any) -> dict[str, Any]:
        with self._lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.proc.stdin.flush()
            reply = self._read(timeout)
        if "error" in reply:
            raise EngineError(f"{reply['error']}\n{reply.get('traceback', '')}")
        return reply

    def generate(self, prompts: list[list[int]], max_tokens: int = 8, **kw: Any) -> list[dict[str, Any]]:
        return self.call("generate", prompts=prompts, max_tokens=max_tokens, **kw)["outputs"]

    def generate_with_pause(self, prompts: list[list[int]], pause_after: int, during: Callable[[], None],
                            max_tokens: int = 8, timeout: float = 300.0, **kw: Any) -> list[dict[str, Any]]:
        """Generate, stopping the engine after `pause_after` steps to run `during` (then it goes on)."""
        with self._lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "generate", "prompts": prompts, "max_tokens": max_tokens,
                                              "pause_after": pause_after, **kw}) + "\n")
            self.proc.stdin.flush()
            reply = self._read(timeout)
            paused = "paused" in reply
            if paused:
                try:
                    during()
                finally:
                    self.proc.stdin.write("resume\n")
                    self.proc.stdin.flush()
                reply = self._read(timeout)
        if "error" in reply:
            raise EngineError(f"{reply['error']}\n{reply.get('traceback', '')}")
        assert paused, f"the engine finished in fewer than {pause_after} steps"
        return reply["outputs"]

    def reset_prefix_cache(self) -> None:
        self.call("reset_prefix_cache")

    def stats(self) -> dict[str, Any]:
        return self.call("stats")

    def chunk_parts(self) -> list[dict[str, Any]]:
        """A chunk's bytes group by group: each group's kind (``full``, ``state``...) and byte count."""
        return list(self.call("chunk_parts")["parts"])

    def block_size(self) -> int:
        """The engine's attention block in tokens (a hybrid model's as vLLM sized it: what `chunk_tokens` must
        equal in align mode)."""
        return int(self.call("block_size")["block_size"])

    def chunk_keys(self, prompts: list[list[int]], salts: list[str | None] | None = None) -> list[list[bytes]]:
        """The connector's chunk keys of each prompt (`salts`: each prompt's cache salt, None for none). They are
        bound to the engine's namespace in the daemon: look them up through ``chunk_client``."""
        reply = self.call("chunk_keys", prompts=prompts, salts=salts)
        self.namespace = str(reply["namespace"])
        self.key_scheme = str(reply["key_scheme"])
        return [[bytes.fromhex(k) for k in chain] for chain in reply["keys"]]

    def chunk_client(self, daemon: Any) -> Any:
        """A client of `daemon` in this engine's namespace and key scheme, where its chunk keys name its chunks
        (at the connector's chunk size)."""
        if not self.namespace:
            self.chunk_keys([])
        tokens = (self.config.get("connector") or {}).get("kv_connector_extra_config", {}).get("chunk_tokens", CHUNK)
        return daemon.client(namespace=self.namespace, chunk_tokens=tokens, key_scheme=self.key_scheme)

    def log_tail(self, n: int = 60) -> str:
        try:
            lines = Path(self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def close(self) -> None:
        """End the engine; the shared-memory segments and semaphores its processes had mapped (tensor-parallel
        workers' among them, which the engine's quick exit leaves behind) are removed."""
        tree = descendants(self.proc.pid) if self.proc.poll() is None else []
        leftovers = shm_files_of(tree, ENGINE_SHM_PREFIXES)
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        deadline = time.monotonic() + 30
        while any(os.path.exists(f"/proc/{p}") for p in tree[1:]) and time.monotonic() < deadline:
            time.sleep(0.2)   # workers end once they see their parent gone
        remove_files(leftovers)
        self._log.close()


class EnginePool:
    """Engines by name, started on first use and kept until `close` (or `keep` drops them)."""

    def __init__(self) -> None:
        self.engines: dict[str, EngineProc] = {}
        self._workdir: str | None = None
        self._models: dict[str, str] = {}

    def use_workdir(self, path: str) -> None:
        """Put the engines' socket (and the model) in `path`, e.g. a daemon's own directory."""
        if self.engines:
            raise RuntimeError("use_workdir comes before the first engine starts")
        self._workdir, self._models = path, {}

    @property
    def workdir(self) -> str:
        if self._workdir is None:
            from ..daemons import short_tempdir

            self._workdir = short_tempdir()
        return self._workdir

    @property
    def socket(self) -> str:
        return os.path.join(self.workdir, "kv.sock")

    @property
    def address(self) -> str:
        return "ipc://" + self.socket

    def env(self) -> dict[str, str]:
        """The engines' environment: the source tree's kvstore, vLLM's CPU settings, and HOME, the XDG dirs and
        TMPDIR in the pool's directory, so whatever vLLM or torch leaves lands there and goes with it."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
        env.update(engine_home_env(self.workdir), PYTHONPATH=str(REPO), VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_TARGET_DEVICE="cpu", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"),
                   TOKENIZERS_PARALLELISM="false")
        return env

    def use_model(self, path: str, family: str = "dense") -> None:
        """Serve `family` from the model saved at `path` (one another engine serves too)."""
        self._models[family] = path

    def model(self, family: str = "dense", size: tuple[int, int] | None = None) -> str:
        """A random-weight model of `family` (`vllm_engine.save_model`; `size`: its hidden size and layer count,
        else the script's), saved once per session."""
        name = family if size is None else f"{family}-{size[0]}x{size[1]}"
        if name not in self._models:
            python = engine_python()
            assert python is not None
            path = os.path.join(self.workdir, "model" if name == "dense" else f"model-{name}")
            subprocess.run([python, str(ENGINE_SCRIPT), "save-model", path, family, *map(str, size or ())],
                           check=True, env=self.env(), cwd=str(REPO), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=300)
            self._models[name] = path
        return self._models[name]

    def connector(self, role: str = "kv_both", **extra: Any) -> dict[str, Any]:
        """A kv_transfer_config for the kvstore connector on the pool's socket."""
        return {
            "kv_connector": "KVStoreConnector", "kv_connector_module_path": "kvstore.connectors.vllm",
            "kv_role": role, "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"address": self.address, "chunk_tokens": CHUNK, "timeout": 2.0,
                                          "retry_s": 0.2, **extra},
        }

    def get(self, name: str, **config: Any) -> EngineProc:
        engine = self.engines.get(name)
        if engine is not None and engine.proc.poll() is None:
            return engine
        python = engine_python()
        assert python is not None
        family = config.pop("family", "dense")
        env = {**self.env(), **config.pop("env", {})}
        size = config.pop("size", None)
        config = {"model": self.model(family, size), "num_blocks": 256, **config}  # 32k tokens of KV: a few MiB
        if family == "mla":
            # On x86 CPUs with AMX tiles vLLM picks its AMX_MLA backend, which takes bf16/fp16 weights only;
            # these float32 models need the reference CPU_MLA backend on every CPU.
            config.setdefault("attention_backend", "CPU_MLA")
        engine = EngineProc(python, config, os.path.join(self.workdir, f"engine-{name}.log"), env)
        self.engines[name] = engine
        return engine

    def keep(self, *names: str) -> None:
        """Close every engine not named (at most a few engine processes at a time)."""
        for name in [n for n in self.engines if n not in names]:
            self.engines.pop(name).close()

    def close(self) -> None:
        self.keep()
        if self._workdir is not None and not os.environ.get("KVSTORE_KEEP_TEST_DIRS"):
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir, self._models = None, {}


POOL = EnginePool()


def engine_python() -> str | None:
    """The vLLM engine virtualenv's python, or None (``venv.engine_python``)."""
    return venv.engine_python("vllm")


def skip_reason() -> str:
    return venv.skip_reason("vllm")


def require_engine() -> str:
    """The vLLM engine virtualenv's python; else skip the test (fail it under CI)."""
    return venv.require_engine("vllm")
