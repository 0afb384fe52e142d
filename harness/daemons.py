"""Every kvstore process a test or benchmark starts, each in a sandbox of its own.

A test must never reach the user's daemon, runtime dir, disk cache or shared-memory names. Rather than trust
each test to pass the right flags, everything goes through this module:

- ``scratch_root()``: one directory ``/tmp/kvs-XXXX`` per process (test session or benchmark run) that holds
  every directory the helpers make; ``short_tempdir()`` makes one inside it (``ipc://`` paths must stay under
  108 bytes, which pytest's ``tmp_path`` can exceed).
- ``sandbox_env(workdir)``: the environment of a child, with ``HOME``, ``XDG_RUNTIME_DIR`` and
  ``XDG_CACHE_HOME`` inside ``workdir`` and the native-kernel cache in the scratch root, so that every default
  path (socket, disk tier, CURVE keys, built kernels) can only land in the sandbox.
- ``DaemonProc``: one ``kvstore serve`` on a socket, disk dir and log in its own directory, in its sandbox.
- ``Daemons``: the one owner of the daemons a fixture or benchmark starts; ``close()`` stops them (SIGTERM,
  SIGKILL after a timeout), removes the arena a killed daemon leaves in ``/dev/shm`` (named from its socket
  and read from its memory maps while it ran), or a stopped one kept with its description for a warm restart,
  and the directories it made. Daemons start with ``--no-adopt`` unless a test asks for ``--adopt``.
- ``run_cli(*args)``: ``python -m kvstore ARGS`` in a fresh sandbox, for tests of the command line.

``KVSTORE_KEEP_TEST_DIRS=1`` keeps the directories (to read a failed test's daemon log).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import kvstore
from .procfs import holders, mapped_arenas
from .wait import wait_for
from kvstore.mapped.arena import arena_path_for
from kvstore.tiers.host.description import description_path_for
from kvstore.tiers.host.journal import journal_path_for
from kvstore.tiers.host.leftovers import find_leftovers, remove

SCRATCH_PREFIX = "kvs-"
OWNER_FILE = "owner.pid"     # in a scratch root: the pid of the process it belongs to (see hygiene.py)
_scratch: list[str] = []   # the process's scratch root, once made
_arenas: set[str] = set()  # every arena a daemon of this process was seen to (or would) use


def known_arenas() -> set[str]:
    """The arenas of every daemon this process started through ``DaemonProc`` (for the session's check)."""
    return set(_arenas)


def scratch_root() -> str:
    """This process's one directory under /tmp for everything the helpers create (made on first use)."""
    if not _scratch:
        root = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir="/tmp")
        os.chmod(root, 0o711)   # others may pass through (tests of file modes), not list it
        with open(os.path.join(root, OWNER_FILE), "w") as f:
            f.write(str(os.getpid()))
        _scratch.append(root)
        atexit.register(remove_scratch_root)
    return _scratch[0]


def remove_scratch_root() -> None:
    if _scratch:
        free_kept_arenas(_scratch[0])
    if _scratch and not keep_dirs():
        shutil.rmtree(_scratch[0], ignore_errors=True)


def free_kept_arenas(under: str | None = None) -> list[str]:
    """Free the arenas (and descriptions) that daemons on sockets under ``under`` (default: this process's
    scratch root) kept at a clean stop, as ``kvstore clean`` would; returns the paths removed."""
    root = (under or (_scratch[0] if _scratch else "")).rstrip("/") + "/"
    if root == "/":
        return []
    return [f.path for f in find_leftovers() if f.socket.startswith(root) and remove(f)]


def keep_dirs() -> bool:
    return bool(os.environ.get("KVSTORE_KEEP_TEST_DIRS"))


def short_tempdir(prefix: str = "d-") -> str:
    """A fresh directory in the scratch root; the caller removes it (or the scratch root goes at exit)."""
    return tempfile.mkdtemp(prefix=prefix, dir=scratch_root())


def sandbox_dirs(workdir: str) -> dict[str, str]:
    """HOME, XDG_RUNTIME_DIR and XDG_CACHE_HOME for a child working in ``workdir`` (made 0700)."""
    home = os.path.join(workdir, "home")
    dirs = {"HOME": home, "XDG_RUNTIME_DIR": os.path.join(workdir, "run"),
            "XDG_CACHE_HOME": os.path.join(home, ".cache")}
    for path in dirs.values():
        os.makedirs(path, mode=0o700, exist_ok=True)
    return dirs


def sandbox_env(workdir: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a kvstore child process confined to ``workdir``."""
    native = os.path.join(scratch_root(), "native")   # the CUDA kernel's cache, never the user's
    return {"KVSTORE_NATIVE_DIR": native, **os.environ, **sandbox_dirs(workdir), **(extra or {})}


def run_cli(*args: str, timeout: float = 60, env: dict[str, str] | None = None, input: str | None = None,
            cwd: str | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """``python -m kvstore ARGS`` in a sandbox of its own, removed afterwards; output captured as text."""
    workdir = short_tempdir("cli-")
    try:
        return subprocess.run([sys.executable, "-m", "kvstore", *args], capture_output=True, text=True,
                              timeout=timeout, env=sandbox_env(workdir, env), input=input, cwd=cwd, check=check)
    finally:
        if not keep_dirs():
            shutil.rmtree(workdir, ignore_errors=True)


def unheld(path: str) -> bool:
    """Whether no live process maps or holds ``path``."""
    return not holders(path)


@dataclass
class DaemonProc:
    """One ``kvstore serve`` process with its socket, disk dir, log and sandbox in ``workdir``."""

    workdir: str
    args: list[str]
    proc: subprocess.Popen | None = None
    log_path: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    arenas: set[str] = field(default_factory=set)   # every arena it was seen to map: removed if left behind

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
        self._remember({arena_path_for(self.socket_path)})
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         env=sandbox_env(self.workdir, self.extra_env))
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Return once the daemon answers a ping; raise RuntimeError (with its log) if it exits or is not ready
        within ``timeout`` seconds."""
        proc = self.proc
        assert proc is not None, "wait_ready before start"
        if not wait_for(lambda: proc.poll() is not None or self._answers(), timeout):
            raise RuntimeError(f"daemon not ready after {timeout}s:\n{self.log()}")
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode}:\n{self.log()}")
        self._remember(mapped_arenas(proc.pid))

    def _answers(self) -> bool:
        """Whether the daemon answers a ping on its socket."""
        if not os.path.exists(self.socket_path):
            return False
        try:
            with kvstore.connect(self.address, timeout=0.5, use_arena=False) as c:
                c.ping()
        except kvstore.DaemonUnavailable:
            return False
        return True

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self._remember(mapped_arenas(self.proc.pid))
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

    def restart_without_adopting(self) -> "DaemonProc":
        """Stop, then start again with --no-adopt instead of --adopt: the kept arena is freed, and the new daemon
        keeps none when it stops. For the last daemon of a test whose engine outlives it and maps the arena,
        which would otherwise keep a kept arena from ever being freed."""
        self.stop()
        self.args[self.args.index("--adopt")] = "--no-adopt"
        return self.start()

    def client(self, **kwargs) -> kvstore.Client:
        kwargs.setdefault("timeout", 10.0)
        return kvstore.connect(self.address, **kwargs)

    def _remember(self, paths: set[str]) -> None:
        self.arenas |= paths
        _arenas.update(paths)

    def remove_leftovers(self) -> list[str]:
        """After the process is gone: unlink the arenas it left (a SIGKILL leaves one); returns them."""
        removed = []
        # A closed client of this process whose objects are still in a reference cycle maps the arena until the
        # collector frees them: collect first, so that only a live holder keeps a file.
        gc.collect()
        for arena in sorted(self.arenas):
            # a clean stop keeps the arena and its description (warm restart), a kill the arena and its journal
            for path in (arena, description_path_for(arena), journal_path_for(arena)):
                if os.path.exists(path) and wait_for(functools.partial(unheld, path), timeout=2.0):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                        removed.append(path)
        return removed


class Daemons:
    """Starts daemons with test-sized defaults and owns them: ``close()`` leaves nothing behind."""

    def __init__(self, test_sizes: bool = True) -> None:
        self.test_sizes = test_sizes   # benchmarks size their daemons themselves
        self.started: list[DaemonProc] = []
        self.dirs: list[str] = []

    def start(self, *args: str, workdir: str | None = None, wait: bool = True,
              env: dict[str, str] | None = None) -> DaemonProc:
        if workdir is None:
            workdir = short_tempdir()
            self.dirs.append(workdir)
        d = DaemonProc(workdir, with_defaults(list(args), workdir, self.test_sizes), extra_env=env or {})
        self.started.append(d)
        return d.start(wait=wait)

    def close(self) -> None:
        for d in self.started:
            try:
                d.stop()
            except Exception:  # noqa: BLE001 - a daemon that hangs in shutdown is killed
                d.kill()
            d.remove_leftovers()
        if not keep_dirs():
            for path in self.dirs:
                shutil.rmtree(path, ignore_errors=True)

    def __enter__(self) -> "Daemons":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def with_defaults(args: list[str], workdir: str, test_sizes: bool = True) -> list[str]:
    """The disk tier in ``workdir`` and (``test_sizes``) small tiers, unless the caller chose otherwise."""
    def given(flag: str) -> bool:
        return any(a == flag or a.startswith(flag + "=") for a in args)

    if not given("--disk-dir"):
        args += ["--disk-dir", os.path.join(workdir, "disk")]
    if not given("--adopt") and not given("--no-adopt"):
        args += ["--no-adopt"]   # a test that restarts a daemon asks for a warm restart by name
    if test_sizes and not given("--host-mem"):
        args += ["--host-mem", "64MiB"]
    if test_sizes and not given("--disk-size"):
        args += ["--disk-size", "256MiB"]
    return args
