"""Real remote stores on loopback for tests and benchmarks.

Each helper starts a server process on free 127.0.0.1 ports in a scratch
directory, waits until it accepts connections, and can stop, pause (SIGSTOP:
a store that is up but does not answer) and restart it on the same ports, so
that a test can take the store away in the middle and bring it back.

- ``RedisServer``: Debian's ``redis-server``, no persistence.
- ``MooncakeCluster``: ``mooncake_master`` (with its built-in HTTP metadata
  server) plus one ``mooncake_client`` storage node that contributes the
  memory the objects live in, so that data is held outside the process under
  test, as it would be on a real deployment.

``require(name)`` finds a binary, and ``require_module(name, what)`` imports a
module, or skips the test with the reason and the one command that installs
what is missing (``EXTRAS_COMMAND``); under CI (env ``CI`` set and not
"false"/"0") a missing one fails the test instead, because CI runs that command.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import NoReturn

__all__ = [
    "MooncakeCluster",
    "RedisCluster",
    "RedisServer",
    "ServerProcess",
    "free_port",
    "extras_required",
    "in_ci",
    "mooncake_binary",
    "require",
    "require_module",
]

EXTRAS_COMMAND = "bash .ci/install-extras.sh"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def extras_required() -> bool:
    """Whether a missing extra (a server, an engine, an interface wheel) fails the test instead of skipping it:
    under CI, except in the run that proves the README's test command on a machine without them
    (``KVSTORE_TEST_BARE=1``, set by .ci/run)."""
    return in_ci() and os.environ.get("KVSTORE_TEST_BARE", "") != "1"


def free_port(below: int = 65536, also: int = 0) -> int:
    """A free loopback port under ``below``; with ``also``, port + ``also`` is free too."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port >= below:
            continue
        if also:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port + also))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free port pair found")


def mooncake_binary(name: str) -> str | None:
    """The native Mooncake executable ``name`` shipped in the PyPI package.

    The console scripts on PATH are Python wrappers; the real binaries sit in
    the package directory, and running them directly gives a pid we can signal.
    """
    spec = importlib.util.find_spec("mooncake")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = Path(folder) / name
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return shutil.which(name)


def require(name: str) -> str:
    """Path of server binary ``name``, or skip (fail under CI) if absent."""

    path = mooncake_binary(name) if name.startswith("mooncake_") else shutil.which(name)
    if path is None:
        _missing(f"{name} not found")
    return path


def require_module(name: str, what: str):
    """Module ``name`` (``what`` says what the tests use it for), or skip (fail under CI) if absent."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        _missing(f"{what} not installed ({exc})")


def _missing(message: str) -> NoReturn:
    import pytest

    message = f"{message}: `{EXTRAS_COMMAND}` installs it"
    if extras_required():
        pytest.fail(message + " -- required when CI is set", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def wait_port(port: int, timeout: float = 15.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def _wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Wait until every thread of ``pid`` is in the stopped state (``T`` in ``/proc/PID/task/*/stat``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        if states and all(state in "Tt" for state in states):
            return
        time.sleep(0.005)
    raise TimeoutError(f"process {pid} did not stop within {timeout}s")


class ServerProcess:
    """One server process: start, stop, pause/resume, restart with the same argv."""

    def __init__(self, argv: list[str], port: int, log_path: Path, env: dict | None = None):
        self.argv = argv
        self.port = port
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 15.0) -> None:
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
            )
        finally:
            log.close()
        try:
            wait_port(self.port, timeout, self.proc)
        except Exception:  # noqa: BLE001 - stopped, then raised as one error with the log
            self.stop()
            raise RuntimeError(f"{self.argv[0]} did not start; log:\n{self.tail()}") from None

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)   # a paused process cannot handle SIGTERM
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def pause(self) -> None:
        """Freeze the server, and return once every thread of it has stopped: a stop signal is only queued when
        ``kill`` returns, and a request sent meanwhile could still be answered."""
        if self.running and self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)
            _wait_stopped(self.proc.pid)

    def resume(self) -> None:
        if self.running and self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self, timeout: float = 15.0) -> None:
        self.stop()
        self.start(timeout)

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""


class RedisServer:
    """``redis-server`` on a free loopback port; ``url`` is ``redis://127.0.0.1:PORT``."""

    def __init__(self, workdir: Path, binary: str = "redis-server", maxmemory: str | None = None,
                 extra: list[str] | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        # A cluster node also listens on port + 10000 (its cluster bus).
        self.port = free_port(55536, 10000) if extra and "--cluster-enabled" in extra else free_port()
        argv = [
            binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self.workdir), "--protected-mode", "yes",
            "--daemonize", "no", "--loglevel", "warning",
        ]
        if maxmemory:
            argv += ["--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru"]
        argv += extra or []
        self.server = ServerProcess(argv, self.port, self.workdir / "redis.log")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> "RedisServer":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        self.server.restart()

    def pause(self) -> None:
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class RedisCluster:
    """Three ``redis-server`` masters joined into a Redis Cluster by ``redis-cli --cluster create``.

    ``url`` is ``redis://127.0.0.1:PORT?cluster=1`` (any node; the client reads the slot map).
    """

    def __init__(self, workdir: Path, binary: str = "redis-server", cli: str = "redis-cli", nodes: int = 3):
        self.workdir = Path(workdir)
        self.cli = cli
        self.nodes = [
            RedisServer(self.workdir / f"node{i}", binary,
                        extra=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                               "--cluster-node-timeout", "2000"])
            for i in range(nodes)
        ]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}?cluster=1"

    def start(self) -> "RedisCluster":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run([self.cli, "--cluster", "create", *addresses, "--cluster-replicas", "0",
                        "--cluster-yes"], check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [subprocess.run([self.cli, "-p", str(node.port), "cluster", "info"],
                                     capture_output=True, text=True, timeout=10).stdout
                      for node in self.nodes]
            if all("cluster_state:ok" in state for state in states):
                return
            time.sleep(0.1)
        raise TimeoutError("redis cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> "RedisCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class MooncakeCluster:
    """``mooncake_master`` + one ``mooncake_client`` storage node on loopback.

    ``url`` is ``mooncake://127.0.0.1:RPC?metadata=http://127.0.0.1:HTTP/metadata``.
    The master serves the metadata over its built-in HTTP server
    (``--enable_http_metadata_server``); the storage node mounts
    ``segment_size`` bytes that hold the objects.
    """

    def __init__(self, workdir: Path, segment_size: str = "512MB",
                 master: str = "mooncake_master", node: str = "mooncake_client",
                 lease_ttl_ms: int | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.rpc_port = free_port()
        self.http_port = free_port()
        self.metrics_port = free_port()
        self.node_port = free_port()
        master_argv = [
            master, f"--rpc_port={self.rpc_port}", "--rpc_address=127.0.0.1",
            "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={self.http_port}",
            "--metrics_host=127.0.0.1", f"--metrics_port={self.metrics_port}",
            "--client_ttl=3", "--rpc_thread_num=2",
        ]
        if lease_ttl_ms is not None:
            master_argv.append(f"--default_kv_lease_ttl={lease_ttl_ms}")
        node_argv = [
            node, "--host=127.0.0.1", f"--port={self.node_port}",
            f"--global_segment_size={segment_size}", "--protocol=tcp",
            f"--master_server_address=127.0.0.1:{self.rpc_port}",
            f"--metadata_server={self.metadata}",
        ]
        env = dict(os.environ, GLOG_minloglevel="1")
        self.master = ServerProcess(master_argv, self.rpc_port, self.workdir / "master.log", env)
        self.node = ServerProcess(node_argv, self.node_port, self.workdir / "node.log", env)

    @property
    def metadata(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    @property
    def master_address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def url(self) -> str:
        return f"mooncake://{self.master_address}?metadata={self.metadata}"

    def start(self) -> "MooncakeCluster":
        try:
            self.master.start()
            wait_port(self.http_port)
            self.node.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.node.stop()
        self.master.stop()

    def restart(self) -> None:
        """Bring the whole store back empty (the master keeps no state)."""
        self.stop()
        self.start()

    def __enter__(self) -> "MooncakeCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
