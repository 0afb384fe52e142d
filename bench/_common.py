"""Shared helpers for benchmarks: a daemon process, timing with medians, memcpy reference, JSON results."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import socket
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from harness.daemons import DaemonProc, Daemons, short_tempdir   # the one way a daemon is started

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(BENCH_DIR, "results")

__all__ = ["BenchDaemon", "DaemonProc", "RESULTS_DIR", "add_output_flag", "native_index", "free_port",
           "latest_path", "machine", "median_seconds",
           "memcpy_seconds", "parse_names", "sample_seconds", "short_tempdir", "start_daemon", "write_result"]


def machine() -> dict:
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class BenchDaemon:
    """A daemon started for a benchmark through the one helper it shares with the tests (``harness/daemons.py``)."""

    daemon: DaemonProc
    owner: Daemons
    tcp: str | None

    @property
    def ipc(self) -> str:
        return self.daemon.address

    @property
    def proc(self) -> subprocess.Popen:
        return self.daemon.proc

    @property
    def workdir(self) -> str:
        return self.daemon.workdir

    def stop(self) -> None:
        self.owner.close()


def start_daemon(*args: str, tcp: bool = True) -> BenchDaemon:
    """A daemon in its own sandbox (socket, disk dir, HOME and XDG dirs in a scratch directory), sized by ``args``."""
    owner = Daemons(test_sizes=False)
    tcp_addr = f"127.0.0.1:{free_port()}" if tcp else None
    flags = ["--log-level", "warning", *args, *(["--tcp", tcp_addr] if tcp_addr else [])]
    try:
        d = owner.start(*flags)
    except BaseException:
        owner.close()
        raise
    return BenchDaemon(d, owner, "tcp://" + tcp_addr if tcp_addr else None)


def native_index() -> str | None:
    """The shared index's C library (``kvstore/native/walk.py``, ``place.py``) as the build made it, or None (not
    built: the Python walk runs; ``python setup.py build_ext --inplace`` builds it in a checkout)."""
    from kvstore import native

    return str(native.library_path("index")) if native.load("index") is not None else None


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


def abba_first(round_index: int) -> bool:
    """Whether A runs first in round ``round_index`` of an interleaved A/B comparison: rounds go in blocks of two,
    A B then B A, so that in every block each side once follows itself and once follows the other (a side that
    runs right after itself pays for what it left behind, such as a daemon's work after its clients leave)."""
    return round_index % 2 == 0


def abba_ratios(a: list[float], b: list[float]) -> list[float]:
    """Per block of two rounds (``abba_first``), A's total over B's: the order's effect cancels within a block.
    A trailing round without its pair is left out."""
    return [(a[i] + a[i + 1]) / (b[i] + b[i + 1]) for i in range(0, min(len(a), len(b)) - 1, 2)
            if b[i] + b[i + 1] > 0]


def memcpy_seconds(nbytes: int, repeat: int) -> float:
    """A plain in-process memcpy of ``nbytes`` between two touched buffers: the physical reference."""
    src = np.random.randint(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    dst[:] = 1
    return median_seconds(lambda: np.copyto(dst, src), repeat)


def timed_put_get(client, keys: list[bytes], payloads: list[np.ndarray], dests: list[np.ndarray],
                  into: bool = False, wait: bool = True) -> tuple[float, float]:
    """Put ``payloads`` under ``keys``, read them back into ``dests`` (as an engine copies into its cache), check
    them and delete the keys; returns (put seconds, get seconds). ``into``: read with ``get_into`` (copied out of
    the arena without a lease where the client can) instead of a lease and a copy of each view; ``wait=False``:
    queued puts (the get then waits for the commit and the flush is timed with it)."""
    t0 = time.perf_counter()
    client.put(keys, payloads, wait=wait)
    t1 = time.perf_counter()
    if into:
        assert client.get_into(keys, dests) == len(keys)
    else:
        with client.get(keys) as views:
            for v, d in zip(views, dests):
                np.copyto(d, np.frombuffer(v, dtype=np.uint8))
    if not wait:
        client.flush()
    t2 = time.perf_counter()
    assert all(np.array_equal(p, d) for p, d in zip(payloads, dests))
    client.delete(keys)
    return t1 - t0, t2 - t1


def parse_names(text: str, flag: str, choices: tuple[str, ...]) -> list[str]:
    """The comma-separated names of ``flag``, each one of ``choices`` (one clear line naming the bad ones)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in choices]
    if bad or not names:
        raise SystemExit(f"{flag}: unknown {bad or 'empty list'}; choose from {','.join(choices)}")
    return names


def add_output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, metavar="JSON",
                        help="write the result here instead (default: bench/results/ for a full run, "
                             "a temporary file for --quick)")


def latest_path(name: str, suffix: str = ".json") -> str:
    """Where a full run of benchmark ``name`` keeps its result: ``bench/results/NAME-latest.json`` (or ``suffix``)."""
    return os.path.join(RESULTS_DIR, f"{name}-latest{suffix}")


def write_result(name: str, payload: dict, quick: bool = False, out: str | None = None) -> str:
    """Write one result as JSON and return its path.

    A full run replaces ``bench/results/NAME-latest.json`` (the figures the docs quote; earlier runs are in git's
    history). A ``quick`` run, or one given ``out``, writes only that file (a temporary one for ``quick``), so
    that a smoke run never replaces the committed figures.
    """
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    payload = {"benchmark": name, "date": stamp, "machine": machine(), **({"quick": True} if quick else {}),
               **payload}
    if out is None and quick:
        fd, out = tempfile.mkstemp(prefix=f"kvstore-{name}-{stamp}-", suffix=".json")
        os.close(fd)
    if out is None:
        os.makedirs(RESULTS_DIR, exist_ok=True)
        out = latest_path(name)
    with open(out, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
    return out
