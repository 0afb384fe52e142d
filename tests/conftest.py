"""Fixtures: a real daemon process on a temporary socket, and clients to talk to it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Iterator

import pytest

import kvstore


@dataclass
class DaemonProc:
    """A ``kvstore serve`` process started by a test."""

    workdir: str
    args: list[str]
    proc: subprocess.Popen | None = None
    log_path: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def socket_path(self) -> str:
        return os.path.join(self.workdir, "kv.sock")

    @property
    def address(self) -> str:
        return "ipc://" + self.socket_path

    def command(self) -> list[str]:
        return [sys.executable, "-m", "kvstore", "serve", "--socket", self.socket_path, *self.args]

    def start(self, wait: bool = True) -> "DaemonProc":
        self.log_path = os.path.join(self.workdir, "daemon.log")
        log = open(self.log_path, "ab")
        env = {**os.environ, **self.extra_env}
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            if os.path.exists(self.socket_path):
                try:
                    with kvstore.connect(self.address, timeout=0.5, use_arena=False) as c:
                        c.ping()
                    return
                except kvstore.DaemonUnavailable:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"daemon not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> "DaemonProc":
        self.stop()
        return self.start()

    def client(self, **kwargs) -> kvstore.Client:
        kwargs.setdefault("timeout", 10.0)
        return kvstore.connect(self.address, **kwargs)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes; True if it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def short_tempdir() -> str:
    # ipc:// socket paths are limited to 107 characters; pytest's tmp_path can be longer.
    return tempfile.mkdtemp(prefix="kvs-", dir="/tmp")


@pytest.fixture
def start_daemon() -> Iterator:
    started: list[DaemonProc] = []
    dirs: list[str] = []

    def start(*args: str, workdir: str | None = None, wait: bool = True, env: dict | None = None) -> DaemonProc:
        if workdir is None:
            workdir = short_tempdir()
            dirs.append(workdir)
        args = list(args)
        if not any(a.startswith("--host-mem") for a in args):
            args += ["--host-mem", "64MiB"]
        if not any(a.startswith("--disk-dir") for a in args):
            args += ["--disk-dir", os.path.join(workdir, "disk")]  # never the user's cache dir
        if not any(a.startswith("--disk-size") for a in args):
            args += ["--disk-size", "256MiB"]
        d = DaemonProc(workdir, args, extra_env=env or {})
        started.append(d)
        return d.start(wait=wait)

    yield start
    for d in started:
        try:
            d.stop()
        except Exception:
            d.kill()
    if not os.environ.get("KVSTORE_KEEP_TEST_DIRS"):  # set it to read the daemon logs of a failed test
        for path in dirs:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon(start_daemon) -> DaemonProc:
    return start_daemon()


@pytest.fixture
def client(daemon) -> Iterator[kvstore.Client]:
    c = daemon.client(namespace="test")
    yield c
    c.close()
