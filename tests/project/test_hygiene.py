"""Tests are guests: every daemon runs in a sandbox, cleanup leaves nothing, and a session that leaks fails.

The session guard (``conftest.machine_left_as_found``) is itself tested by running small pytest sessions in a
subprocess with this suite's conftest as a plugin: one that leaks an arena, a ``/tmp/kvs-*`` directory and a
file in the (stand-in) user's cache must fail and name all three; one that SIGKILLs its daemon must pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import kvstore
from kvstore.mapped.arena import arena_path_for
from kvstore.tiers.host.description import description_path_for

from conftest import wait_for
from harness.daemons import Daemons, run_cli, sandbox_env, short_tempdir
from harness.engines.sandbox import remove_files, shm_files_of
from support.paths import ROOT, TESTS



def environ_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item]
    return {k.decode(): v.decode() for k, v in pairs}


def test_fixture_daemons_run_in_their_own_sandbox(daemon):
    env = environ_of(daemon.proc.pid)
    for name in ("HOME", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME"):
        assert env[name].startswith(daemon.workdir + "/"), (name, env[name])
    assert "--disk-dir" in daemon.args and daemon.socket_path.startswith(daemon.workdir + "/")


def test_default_paths_of_a_bare_serve_stay_in_the_sandbox():
    """``kvstore serve`` with no --socket and no --disk-dir, as the README runs it: nothing reaches the user."""
    workdir = short_tempdir()
    log_path = os.path.join(workdir, "serve.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kvstore", "serve", "--host-mem", "16MiB", "--disk-size",
                                 "16MiB"], stdout=log, stderr=subprocess.STDOUT, env=sandbox_env(workdir))
    try:
        assert wait_for(lambda: "event=ready" in open(log_path).read() or proc.poll() is not None, 30)
        assert proc.poll() is None and "event=ready" in open(log_path).read(), open(log_path).read()
        ready = next(line for line in open(log_path) if "event=ready" in line)
        socket_path = ready.split("socket=", 1)[1].split()[0]
        disk_dir = ready.split("disk_dir=", 1)[1].split()[0]
        assert os.path.realpath(socket_path).startswith(os.path.realpath(workdir) + "/"), ready
        assert os.path.realpath(disk_dir).startswith(os.path.realpath(workdir) + "/"), ready
        with kvstore.connect("ipc://" + socket_path, timeout=5) as c:
            arena = c.server_info["arena"]["path"]
        assert arena == arena_path_for(socket_path)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    # a clean stop keeps the arena and its description for a warm restart; kvstore clean frees both
    kept = [arena, description_path_for(arena)]
    assert all(os.path.exists(p) for p in kept)
    cleaned = run_cli("clean", "--socket", socket_path)
    shutil.rmtree(workdir)
    assert cleaned.returncode == 0 and all(p in cleaned.stdout for p in kept), cleaned.stdout
    assert not any(os.path.exists(p) for p in kept)


def test_cleanup_removes_the_arena_of_a_killed_daemon():
    with Daemons() as daemons:
        d = daemons.start()
        with d.client(namespace="t") as c:
            arena = c.server_info["arena"]["path"]
        d.kill()
        assert os.path.exists(arena)   # what SIGKILL leaves behind
    assert not os.path.exists(arena) and not os.path.exists(d.workdir)


def run_session(test_source: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A pytest session of one test file with this suite's conftest (and so its guard) as a plugin."""
    where = short_tempdir("session-")
    with open(os.path.join(where, "test_inner.py"), "w") as f:
        f.write(textwrap.dedent(test_source))
    environ = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([TESTS, ROOT, os.environ.get("PYTHONPATH", "")])}
    try:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                               "test_inner.py"], cwd=where, env=environ, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(where, ignore_errors=True)


LEAKY = """
    import os

    def test_leaks():
        open(os.environ["LEAK_ARENA"], "wb").close()
        os.mkdir(os.environ["LEAK_DIR"])
        os.makedirs(os.path.join(os.environ["LEAK_USER_CACHE"], "kvstore", "chunks"))
        open(os.path.join(os.environ["LEAK_USER_CACHE"], "kvstore", "chunks", "junk"), "wb").close()
"""


def test_a_session_that_leaks_fails_and_names_each_leak():
    token = uuid.uuid4().hex[:12]
    arena = f"/dev/shm/kvstore.{os.getuid()}.selftest-{token}.arena"
    leak_dir = f"/tmp/kvs-selftest-{token}"
    user_cache = short_tempdir("user-cache-")   # stands in for the user's ~/.cache
    try:
        # Strict: these leaks are made by hand, so only "no other session ran" could pin them on this one.
        result = run_session(LEAKY, {"LEAK_ARENA": arena, "LEAK_DIR": leak_dir, "LEAK_USER_CACHE": user_cache,
                                     "XDG_CACHE_HOME": user_cache, "KVSTORE_TEST_STRICT": "1"})
        out = result.stdout + result.stderr
        assert result.returncode != 0, out
        assert "did not leave the machine as it found it" in out, out
        assert f"shared-memory arena left behind: {arena}" in out
        assert f"directory left behind: {leak_dir}" in out
        assert f"the user's kvstore directory was touched: {user_cache}/kvstore/chunks/junk is new" in out
    finally:
        for path in (arena, leak_dir):
            if os.path.isdir(path):
                os.rmdir(path)
            elif os.path.exists(path):
                os.unlink(path)
        shutil.rmtree(user_cache)


TIDY = """
    def test_kills_its_daemon(start_daemon):
        d = start_daemon()
        with d.client(namespace="t") as c:
            c.put(c.chunk_keys(list(range(256))), [b"x" * 100])
        d.kill()
"""


def test_a_session_that_kills_its_daemon_leaves_nothing_and_passes():
    user_cache = short_tempdir("user-cache-")
    try:
        result = run_session(TIDY, {"XDG_CACHE_HOME": user_cache})
        assert result.returncode == 0, result.stdout + result.stderr
        assert os.listdir(user_cache) == []
    finally:
        shutil.rmtree(user_cache)


def test_no_test_or_benchmark_makes_its_own_directories_in_tmp():
    """Scratch directories come from ``daemons.short_tempdir`` (the run's scratch root), never straight from /tmp."""
    offenders = []
    for folder in ("tests", "bench"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if not name.endswith(".py") or name in ("daemons.py", "hygiene.py", "test_hygiene.py"):
                continue
            source = open(os.path.join(ROOT, folder, name)).read()
            for needle in ('dir="/tmp"', "dir='/tmp'", 'join("/tmp"', '"/tmp/kvs-'):
                if needle in source:
                    offenders.append(f"{folder}/{name}: {needle}")
    assert not offenders, offenders


def test_an_engines_semaphores_are_found_though_its_mappings_name_a_deleted_file():
    """What an engine's multiprocessing semaphores leave in /dev/shm when its processes are killed is found from
    the live processes (by inode: glibc maps a temporary name and links the semaphore's name to it), so the
    engine runners remove it."""
    code = ("import multiprocessing as mp, time\n"
            "lock = mp.get_context('spawn').Lock()\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
    found: set[str] = set()
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        found = shm_files_of([child.pid], ("sem.mp-",))
        assert len(found) == 1 and os.path.exists(next(iter(found)))
        with open(f"/proc/{child.pid}/maps") as f:
            assert next(iter(found)) not in f.read()   # the mapping names another, deleted, file
        assert shm_files_of([child.pid], ("psm_",)) == set()   # only the prefixes asked for
    finally:
        child.kill()
        child.wait()
        remove_files(found)
    assert not any(os.path.exists(path) for path in found)

