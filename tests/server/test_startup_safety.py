"""Start-up refuses bad paths and sizes in one line, never removes what it did not create, and gives back
everything it took when it fails (issue 14, items 1, 2, 5, 6, 7, 9 and 19).

Daemons started by hand here run in their own temporary directories (socket, disk tier, fake HOME and
XDG_RUNTIME_DIR), with a small host tier; the /dev/shm names checked are those derived from these sockets only.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys

import pytest
from conftest import wait_for
from harness.daemons import run_cli, sandbox_env, short_tempdir
from support.paths import ROOT
from support.users import as_other_user

import kvstore
from kvstore.defaults import default_socket
from kvstore.errors import ConfigError
from kvstore.server.lifecycle.startup import share_socket_dir
from kvstore.mapped.arena import arena_path_for

SMALL = ("--host-mem", "16MiB")


@pytest.fixture
def workdir():
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def serve(*args: str, cwd: str | None = None, env: dict | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess:
    return run_cli("serve", *args, cwd=cwd, env=env, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The one error line of a refused start (event lines logged before it are fine; a traceback is not)."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    errors = [line for line in result.stderr.splitlines() if not line.startswith("ts=")]
    assert len(errors) == 1 and errors[0].startswith("kvstore: error: "), result.stderr
    return errors[0]


def shm_names_of(socket_path: str) -> set[str]:
    """The /dev/shm files a daemon on ``socket_path`` would own (host arena, and a CPU-backed GPU pool)."""
    paths = (arena_path_for(socket_path), arena_path_for(socket_path + "#gpu"))
    return {p for p in paths if os.path.exists(p)}


def tree(path: str) -> set[str]:
    return {os.path.relpath(os.path.join(top, name), path)
            for top, dirs, files in os.walk(path) for name in dirs + files}


class Started:
    """A ``kvstore serve`` run by hand until it answers; stopped with SIGTERM."""

    def __init__(self, args: list[str], socket_path: str, cwd: str, env: dict | None = None) -> None:
        self.socket_path = socket_path
        self.log_path = os.path.join(cwd, "serve.log")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "kvstore", "serve", *args], cwd=cwd,
                                         stdout=log, stderr=subprocess.STDOUT, env=sandbox_env(cwd, env))
        if not wait_for(lambda: self.proc.poll() is not None or self._answers(), 30) or self.proc.poll() is not None:
            self.stop()
            raise AssertionError("daemon not ready:\n" + self.log())

    def _answers(self) -> bool:
        """Whether the daemon answers a ping on its socket."""
        if not os.path.exists(self.socket_path):
            return False
        try:
            with kvstore.connect("ipc://" + self.socket_path, timeout=0.5, use_arena=False) as c:
                c.ping()
        except kvstore.DaemonUnavailable:
            return False
        return True

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


# -- item 1: only a stale socket is ever replaced ----------------------------------------------------------

def _make_regular(path: str) -> None:
    with open(path, "w") as f:
        f.write("notes\n")


def _make_dir(path: str) -> None:
    os.mkdir(path)
    _make_regular(os.path.join(path, "inside.txt"))


def _make_link(path: str) -> None:
    _make_regular(path + ".target")
    os.symlink(path + ".target", path)


@pytest.mark.parametrize("make, kind", [(_make_regular, "a regular file"), (_make_dir, "a directory"),
                                        (_make_link, "a symbolic link"), (os.mkfifo, "a named pipe")])
def test_something_other_than_a_socket_at_the_path_is_refused_and_kept(workdir, make, kind):
    path = os.path.join(workdir, "notes.txt")
    make(path)
    before = tree(workdir)
    line = one_line_error(serve("--socket", "notes.txt", "--disk-size", "0", *SMALL, cwd=workdir))
    assert f"{path} is {kind}, not a socket" in line
    assert tree(workdir) == before   # nothing removed, nothing left behind (no lock file either)
    if kind == "a regular file":
        assert open(path).read() == "notes\n"
    assert not shm_names_of(path)


def test_a_socket_another_program_listens_on_is_refused(workdir):
    path = os.path.join(workdir, "kv.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    try:
        line = one_line_error(serve("--socket", path, "--disk-size", "0", *SMALL))
        assert "is listening on" in line and stat.S_ISSOCK(os.lstat(path).st_mode)
        assert not os.path.exists(path + ".lock") and not shm_names_of(path)
    finally:
        listener.close()


# -- item 2: a failed start gives back what it took ---------------------------------------------------------

def test_second_daemon_on_the_same_disk_dir_exits_2_and_leaves_no_arena(start_daemon, workdir):
    first = start_daemon()
    second_socket = os.path.join(workdir, "second", "kv.sock")
    assert not shm_names_of(second_socket)
    line = one_line_error(serve("--socket", second_socket, "--disk-dir", os.path.join(first.workdir, "disk"), *SMALL))
    assert "another kvstore daemon uses" in line
    assert not shm_names_of(second_socket)
    assert tree(workdir) == set()   # its socket directory, lock and socket are gone too
    with first.client() as c:
        c.ping()


def _busy_tcp_port() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


@pytest.mark.parametrize("flag", ["--tcp", "--metrics-port"])
def test_failure_after_the_arena_exists_removes_it_and_everything_else(workdir, flag):
    busy = _busy_tcp_port()
    port = busy.getsockname()[1]
    socket_path = os.path.join(workdir, "a", "b", "kv.sock")
    value = f"127.0.0.1:{port}" if flag == "--tcp" else str(port)
    try:
        line = one_line_error(serve("--socket", socket_path, "--disk-dir", os.path.join(workdir, "c", "disk"),
                                    "--disk-size", "64MiB", flag, value, *SMALL))
    finally:
        busy.close()
    assert flag in line and "cannot listen" in line
    assert not shm_names_of(socket_path)
    assert tree(workdir) == set()   # socket, locks and the directories start-up created are gone


# -- item 5: default paths -----------------------------------------------------------------------------------

def test_default_socket_and_keys_live_in_the_runtime_dir(workdir, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", workdir)
    assert default_socket() == os.path.join(workdir, "kvstore", "kvstore.sock")
    result = run_cli("keygen", env={"XDG_RUNTIME_DIR": workdir})
    assert result.returncode == 0, result.stderr
    assert os.path.exists(os.path.join(workdir, "kvstore", "curve", "server.key_secret"))
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "`$XDG_RUNTIME_DIR/kvstore/kvstore.sock`" in "".join(readme.splitlines(True)[:40])   # the first screen
    keygen_help = run_cli("keygen", "--help")
    assert keygen_help.returncode == 0 and "$XDG_RUNTIME_DIR/kvstore/curve" in keygen_help.stdout
    unit = open(os.path.join(ROOT, "systemd", "kvstore.service")).read()
    toml = open(os.path.join(ROOT, "systemd", "kvstore.toml")).read()
    runtime = re.search(r"^RuntimeDirectory=(\S+)$", unit, re.M).group(1)
    assert f'socket = "/run/{runtime}/kvstore.sock"' in toml   # the unit's runtime dir, named as the README's


def test_daemon_with_no_socket_flag_listens_in_the_runtime_dir(workdir):
    env = {"XDG_RUNTIME_DIR": workdir}
    expected = os.path.join(workdir, "kvstore", "kvstore.sock")
    daemon = Started(["--disk-size", "0", "--no-adopt", *SMALL], expected, workdir, env)
    try:
        assert f"socket={expected} " in daemon.log()
    finally:
        assert daemon.stop() == 0
    assert not shm_names_of(expected)


# -- item 6: unusable socket paths ---------------------------------------------------------------------------

@pytest.mark.parametrize("path, needle", [("/proc/kv.sock", "--socket"), ("", "the path is empty"),
                                          ("   ", "the path is empty"), ("sub/", "names a directory")])
def test_unusable_socket_path_is_one_line_and_creates_nothing(workdir, path, needle):
    line = one_line_error(serve("--socket", path, "--disk-size", "0", *SMALL, cwd=workdir))
    assert needle in line
    assert tree(workdir) == set()   # no ./.lock, no directory
    assert not os.path.exists("/proc/kv.sock.lock")


# -- item 7: every directory the daemon creates is 0700 -----------------------------------------------------

def test_every_directory_level_the_daemon_creates_is_owner_only(workdir):
    os.chmod(workdir, 0o755)   # not ours to change: it existed before
    home, runtime = os.path.join(workdir, "home"), os.path.join(workdir, "run")
    os.mkdir(home, 0o755)
    os.mkdir(runtime, 0o755)
    env = {"HOME": home, "XDG_RUNTIME_DIR": runtime, "XDG_CACHE_HOME": ""}
    socket_path = os.path.join(workdir, "a", "b", "kv.sock")
    first = Started(["--socket", "a/b/kv.sock", "--disk-size", "64MiB", *SMALL], socket_path, workdir, env)
    second = Started(["--disk-size", "64MiB", "--socket", os.path.join(runtime, "kvstore", "kvstore.sock"),
                      "--disk-dir", os.path.join(workdir, "c", "d", "disk"), *SMALL],
                     os.path.join(runtime, "kvstore", "kvstore.sock"), workdir, env)
    try:
        made = ["a", "a/b", "home/.cache", "home/.cache/kvstore", "home/.cache/kvstore/chunks", "run/kvstore",
                "c", "c/d", "c/d/disk"]
        modes = {d: stat.S_IMODE(os.stat(os.path.join(workdir, d)).st_mode) for d in made}
        assert modes == dict.fromkeys(made, 0o700)
        for existing in (workdir, home, runtime):
            assert stat.S_IMODE(os.stat(existing).st_mode) == 0o755
    finally:
        assert first.stop() == 0 and second.stop() == 0


# -- item 9: disk sizes ------------------------------------------------------------------------------------

def test_disk_size_larger_than_the_filesystem_is_refused_with_the_numbers(workdir):
    line = one_line_error(serve("--socket", os.path.join(workdir, "kv.sock"), "--disk-dir",
                                os.path.join(workdir, "disk"), "--disk-size", "99TiB", *SMALL))
    total = shutil.disk_usage(workdir).total
    assert "99.0 TiB is larger than the filesystem" in line and "in all" in line and "free" in line, line
    assert total < 99 << 40
    assert tree(workdir) == set()


def test_disk_size_below_one_chunk_is_refused_with_the_numbers(workdir):
    line = one_line_error(serve("--socket", os.path.join(workdir, "kv.sock"), "--disk-dir",
                                os.path.join(workdir, "disk"), "--disk-size", "1KiB", *SMALL))
    assert "1.0 KiB is below the smallest disk tier, 8.0 KiB (a 4.0 KiB header and one 4.0 KiB block)" in line
    assert tree(workdir) == set()


# -- item 19: the ready line shows what is in force ---------------------------------------------------------

def test_ready_line_shows_sizes_in_force_and_the_absolute_socket(workdir):
    socket_path = os.path.join(workdir, "rel", "kv.sock")
    daemon = Started(["--socket", "rel/kv.sock", "--disk-dir", "disk", *SMALL], socket_path, workdir)
    try:
        ready = next(line for line in daemon.log().splitlines() if "event=ready" in line)
    finally:
        assert daemon.stop() == 0
    assert f"socket={socket_path} " in ready and f"disk_dir={os.path.join(workdir, 'disk')} " in ready
    assert "max_chunk=16.0MiB" in ready and "disk_queue=4.0MiB" in ready   # the host tier, a quarter of it
    size = re.search(r"disk_size=(\S+)", ready).group(1)
    assert size not in ("auto", "0B") and size.endswith("iB"), ready


# -- listening errors name the flag to change and the address once -------------------------------------------

def test_tcp_in_use_names_the_address_once(workdir):
    busy = _busy_tcp_port()
    address = f"127.0.0.1:{busy.getsockname()[1]}"
    try:
        line = one_line_error(serve("--socket", os.path.join(workdir, "kv.sock"), "--disk-dir",
                                    os.path.join(workdir, "disk"), "--tcp", address, *SMALL))
    finally:
        busy.close()
    assert line.count(address) == 1 and "another process listens there" in line, line


def test_metrics_host_not_on_this_machine_names_the_host_not_the_port(workdir):
    line = one_line_error(serve("--socket", os.path.join(workdir, "kv.sock"), "--disk-dir",
                                os.path.join(workdir, "disk"), "--metrics-port", "19999",
                                "--metrics-host", "10.99.99.99", *SMALL))
    assert line.startswith("kvstore: error: --metrics-host: 10.99.99.99 is not an address of this host"), line
    assert "another port" not in line


# -- a socket in a directory anyone may replace it in ---------------------------------------------------------

def test_socket_in_a_world_writable_directory_of_ones_own_is_warned_about(workdir):
    shared = os.path.join(workdir, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)   # no sticky bit: anyone could rename the socket away and put theirs there
    socket_path = os.path.join(shared, "kv.sock")
    daemon = Started(["--socket", socket_path, "--disk-dir", os.path.join(workdir, "disk"), *SMALL], socket_path,
                     workdir)
    try:
        warned = [line for line in daemon.log().splitlines() if "event=socket_dir_unsafe" in line]
    finally:
        assert daemon.stop() == 0
    assert len(warned) == 1 and f"chmod o-w {shared}" in warned[0] and "level=WARNING" in warned[0], warned


def test_socket_in_a_sticky_world_writable_directory_is_not_warned_about(workdir):
    shared = os.path.join(workdir, "tmp")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)   # as /tmp: others cannot remove what is ours
    socket_path = os.path.join(shared, "kv.sock")
    daemon = Started(["--socket", socket_path, "--disk-dir", os.path.join(workdir, "disk"), *SMALL], socket_path,
                     workdir)
    try:
        assert "socket_dir_unsafe" not in daemon.log()
    finally:
        assert daemon.stop() == 0


def test_socket_in_another_users_world_writable_directory_is_refused(workdir):
    if os.getuid() != 0:
        pytest.skip("making a directory that belongs to another user needs root")
    theirs = os.path.join(workdir, "theirs")
    os.mkdir(theirs)
    os.chown(theirs, 65534, 65534)
    os.chmod(theirs, 0o777)
    line = one_line_error(serve("--socket", os.path.join(theirs, "kv.sock"), "--disk-dir",
                                os.path.join(workdir, "disk"), *SMALL))
    assert f"--socket: directory {theirs} is writable by every user, has no sticky bit and belongs to uid 65534" \
        in line, line
    assert os.listdir(theirs) == []


# -- socket_group: other local users reach the stream socket, never the arena -------------------------------

def _a_group() -> int:
    """A group the daemon may give its socket to: another one when we are root, else our own."""
    if os.getuid() == 0:
        try:
            return grp.getgrnam("nogroup").gr_gid
        except KeyError:
            pass
    return os.getgid()


@pytest.mark.parametrize("value, needle", [("no-such-group-kvs", "no group 'no-such-group-kvs' on this machine"),
                                           ("4000000000", "no group '4000000000' on this machine")])
def test_an_unknown_socket_group_is_one_line(workdir, value, needle):
    line = one_line_error(serve("--socket", os.path.join(workdir, "kv.sock"), "--disk-size", "0",
                                "--socket-group", value, *SMALL))
    assert line.startswith("kvstore: error: --socket-group: ") and needle in line, line


def test_a_socket_group_gets_the_stream_socket_and_the_directories_the_daemon_made(workdir):
    os.chmod(workdir, 0o755)
    gid = _a_group()
    socket_path = os.path.join(workdir, "a", "b", "kv.sock")
    daemon = Started(["--socket", socket_path, "--disk-size", "0", "--socket-group", str(gid), *SMALL],
                     socket_path, workdir)
    try:
        def shared(path: str) -> tuple[int, int]:
            st = os.stat(path)
            return stat.S_IMODE(st.st_mode), st.st_gid
        assert shared(os.path.join(workdir, "a")) == shared(os.path.join(workdir, "a", "b")) == (0o710, gid)
        assert shared(socket_path + ".stream") == (0o660, gid)
        assert shared(socket_path)[0] & 0o077 == 0 and shared(arena_path_for(socket_path))[0] == 0o600
        assert stat.S_IMODE(os.stat(workdir).st_mode) == 0o755   # not the daemon's to change: it was there
        assert "socket_group_unreachable" not in daemon.log()
    finally:
        assert daemon.stop() == 0


def test_a_socket_group_that_cannot_pass_a_directory_is_warned_about(workdir):
    private = os.path.join(workdir, "private")
    os.mkdir(private, 0o700)   # there before the daemon: left as it is, and named
    socket_path = os.path.join(private, "kv.sock")
    daemon = Started(["--socket", socket_path, "--disk-size", "0", "--socket-group", str(_a_group()), *SMALL],
                     socket_path, workdir)
    try:
        warned = [line for line in daemon.log().splitlines() if "event=socket_group_unreachable" in line]
    finally:
        assert daemon.stop() == 0
    assert len(warned) == 1 and f"chmod g+x {private}" in warned[0], warned
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700


def test_a_socket_group_the_daemons_user_is_not_in_is_refused(workdir):
    if os.getuid() != 0:
        pytest.skip("needs root to run the check as another user (setuid in a child)")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user to run the check as")

    def check() -> list[str]:
        try:
            share_socket_dir(os.path.join(workdir, "kv.sock"), 0, [])
            return ["accepted"]
        except ConfigError as exc:
            return [str(exc)]

    assert as_other_user(nobody.pw_uid, nobody.pw_gid, check) == [
        "--socket-group: the daemon's user is not a member of group 0, so it cannot give the socket to it; add the "
        "user to the group (or run the daemon as root)"]
