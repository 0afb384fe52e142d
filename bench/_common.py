"""Shared helpers for benchmarks: a daemon process, timing with medians, memcpy reference, JSON results."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def machine() -> dict:
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class BenchDaemon:
    workdir: str
    proc: subprocess.Popen
    tcp: str | None

    @property
    def ipc(self) -> str:
        return "ipc://" + os.path.join(self.workdir, "kv.sock")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_daemon(*args: str, tcp: bool = True) -> BenchDaemon:
    import kvstore

    workdir = tempfile.mkdtemp(prefix="kvb-", dir="/tmp")
    sock = os.path.join(workdir, "kv.sock")
    tcp_addr = f"127.0.0.1:{free_port()}" if tcp else None
    if not any(a.startswith("--disk-dir") for a in args):
        args = (*args, "--disk-dir", os.path.join(workdir, "disk"))  # never the user's cache dir
    cmd = [sys.executable, "-m", "kvstore", "serve", "--socket", sock, "--log-level", "warning", *args]
    if tcp_addr:
        cmd += ["--tcp", tcp_addr]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with kvstore.connect("ipc://" + sock, timeout=0.5, use_arena=False) as c:
                c.ping()
            break
        except kvstore.DaemonUnavailable:
            if proc.poll() is not None:
                raise RuntimeError("daemon failed to start")
            time.sleep(0.05)
    return BenchDaemon(workdir, proc, "tcp://" + tcp_addr if tcp_addr else None)


def sample_seconds(fn: Callable[[], None], repeat: int, warmup: int = 1) -> list[float]:
    """The time of each of ``repeat`` calls of ``fn``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_seconds(fn: Callable[[], None], repeat: int, warmup: int = 1) -> float:
    return statistics.median(sample_seconds(fn, repeat, warmup))


def memcpy_seconds(nbytes: int, repeat: int) -> float:
    """A plain in-process memcpy of ``nbytes`` between two touched buffers: the physical reference."""
    src = np.random.randint(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    dst[:] = 1
    return median_seconds(lambda: np.copyto(dst, src), repeat)


def write_result(name: str, payload: dict) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    payload = {"benchmark": name, "date": stamp, "machine": machine(), **payload}
    path = os.path.join(RESULTS_DIR, f"{name}-{stamp}.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
    latest = os.path.join(RESULTS_DIR, f"{name}-latest.json")
    shutil.copyfile(path, latest)
    return path
