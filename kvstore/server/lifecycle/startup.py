"""Start-up checks and claims on the file system: the socket path, its directory, the locks, a stale socket.

Everything here either refuses with one ``ConfigError`` line (exit 2) before it changes anything, or returns what
it took so that the daemon's exit stack can give it back, newest first, should a later step fail.

The socket path. Whatever sits at ``--socket`` is looked at before anything is created: a regular file, a
directory, a link or a device there is refused (a user who swapped ``--socket`` and ``--config`` must not lose
the config), and only a socket may be replaced, and only once the lock is held and nothing answers on it (a
daemon killed with SIGKILL leaves its socket behind; a program that is not ours but listens there is refused).

Locks. An exclusive ``flock`` on ``<socket>.lock`` (and ``<disk dir>/.lock``) for the daemon's life; the kernel
drops it if the process dies. The holder removes the lock file when it stops, whoever made it: a file left by a
killed predecessor is the new holder's once it holds the lock, so it must not outlive that holder too. Because a
file can be removed between another process's ``open`` and its ``flock``, the lock is only held once the path
still names the inode that was locked (else it is taken again on the new file), which is also why removing it
while holding it is safe.

``Claims`` is the one owner of what start-up took: an exit stack of releases (closed by the daemon's ``close``,
and at once by a failed start-up), the directories start-up created (removed only when start-up fails: a
runtime directory is meant to outlive one daemon) and the files a forced exit must still unlink.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable

import zmq

from ... import logs
from ...errors import ConfigError
from ...security.paths import make_private_dirs, remove_created_dirs, socket_dir_risk

PROBE_TIMEOUT_S = 0.5
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symbolic link"),
          (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def file_kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a socket")


def check_socket_path(path: str) -> None:
    """Refuse a ``--socket`` path where something other than a socket exists (nothing is changed here)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"--socket: cannot use {path}: {exc.strerror}; choose another --socket") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"--socket: {path} is {file_kind(st.st_mode)}, not a socket; kvstore only replaces a "
                          f"stale socket of its own: choose another --socket")


def check_socket_dir(path: str) -> None:
    """Refuse, or warn about, a socket whose directories let anyone replace it (``security/paths.py``)."""
    risk = socket_dir_risk(path)
    if risk is None:
        return
    if risk.refuse:
        raise ConfigError(risk.line)
    logs.warning("socket_dir_unsafe", directory=risk.directory, message=risk.line)


def share_socket_dir(path: str, gid: int, created: list[str]) -> None:
    """``socket_group``: let the group pass the directories this start created for the socket (``--x`` for the
    group: 0710, never anyone else's), then warn about any level above the socket that the group cannot pass
    (``socket_group_unreachable``, naming the level and the fix); a directory that was already there is never
    changed. The socket files themselves are the stream's (0660, the group's) and ZeroMQ's (0600, the daemon
    user's alone).

    Raises:
        ConfigError: a directory cannot be given to the group (the daemon's user is not in it, and not root).
    """
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise ConfigError(f"--socket-group: the daemon's user is not a member of group {gid}, so it cannot give the "
                          f"socket to it; add the user to the group (or run the daemon as root)")
    for level in created:
        try:
            os.chown(level, -1, gid)
            os.chmod(level, 0o710)
        except OSError as exc:
            raise ConfigError(f"--socket-group: cannot give {level} to group {gid}: {exc.strerror}; the daemon's "
                              f"user must be a member of that group (or root)") from None
    level = os.path.dirname(os.path.abspath(path))
    while True:
        st = os.stat(level)
        if not (st.st_mode & stat.S_IXOTH or (st.st_gid == gid and st.st_mode & stat.S_IXGRP)):
            logs.warning("socket_group_unreachable", directory=level,
                         message=f"--socket-group: members of group {gid} cannot pass {level} to reach the socket; "
                                 f"run chgrp {gid} {level} && chmod g+x {level} (or chmod o+x {level}), or choose "
                                 f"another --socket")
            return
        parent = os.path.dirname(level)
        if parent == level:
            return
        level = parent


def bind_failure(transport: str, address: str, exc: zmq.ZMQError) -> str:
    """One line for a socket that cannot listen, naming the address once (zmq's own text repeats it)."""
    flag = "--socket" if transport == "ipc" else "--tcp"
    if exc.errno == errno.EADDRINUSE:
        return f"{flag}: cannot listen on {address}: another process listens there; stop it or choose another {flag}"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{flag}: cannot listen on {address}: that host is not an address of this machine; give one of its own"
    return f"{flag}: cannot listen on {address}: {exc.strerror}; choose another {flag}"


def check_writable_dir(directory: str, flag: str) -> None:
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}: directory {directory} is not writable; choose another {flag}")


def socket_answers(path: str) -> bool:
    """Whether a process accepts connections on the unix socket ``path`` (refused: a stale socket)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(path)
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        raise ConfigError(f"--socket: cannot tell whether {path} is in use ({exc.strerror}); "
                          f"remove it yourself if it is stale, or choose another --socket") from None
    finally:
        probe.close()


def remove_stale_socket(path: str) -> None:
    """With the lock held: remove a socket nobody answers on (a crashed daemon's); refuse a live one."""
    check_socket_path(path)
    if not os.path.lexists(path):
        return
    if socket_answers(path):
        raise ConfigError(f"--socket: a process that is not a kvstore daemon is listening on {path}; "
                          f"stop it or choose another --socket")
    logs.warning("stale_socket_removed", path=path)
    os.unlink(path)


@dataclass
class FileLock:
    path: str
    fd: int

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            os.unlink(self.path)   # while still holding it: see the module docstring
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = -1


def _open_lock_file(path: str, flag: str) -> int:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return os.open(path, flags)   # a killed holder's file: it is ours to remove once we hold it
    except OSError as exc:
        reason = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ConfigError(f"{flag}: cannot open the lock file {path}: {reason}; choose another {flag}") from None


def exclusive_lock(path: str, held_message: str, flag: str) -> FileLock:
    """Hold an exclusive flock on ``path`` for the process's life (the kernel drops it if we crash)."""
    while True:
        fd = _open_lock_file(path, flag)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError(f"{flag}: the lock file {path} is not a regular file; choose another {flag}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(held_message) from None
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        mine = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
            return FileLock(path, fd)
        os.close(fd)   # the previous holder removed the file after we opened it: lock the new one


@dataclass
class Claims:
    releases: ExitStack = field(default_factory=ExitStack)
    created_dirs: ExitStack = field(default_factory=ExitStack)
    leftovers: list[str] = field(default_factory=list)   # socket, lock and arena files, for a forced exit

    def take(self, release: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """``release`` runs at close, before everything taken earlier is released."""
        self.releases.callback(release, *args, **kwargs)

    def made_dirs(self, created: list[str]) -> None:
        self.created_dirs.callback(remove_created_dirs, created)

    def private_dirs(self, path: str, flag: str) -> list[str]:
        """Create the missing levels of ``path`` (0700), removed again if the start fails; returns them."""
        try:
            created = make_private_dirs(path)
        except OSError as exc:
            raise ConfigError(f"{flag}: cannot create {path}: {exc.strerror}; choose another {flag}") from None
        self.made_dirs(created)
        return created

    def hold(self, lock: FileLock) -> None:
        self.take(lock.release)
        self.leftovers.append(lock.path)

    def release_all(self) -> None:
        self.releases.close()

    def give_back(self) -> None:
        """Start-up failed: release everything, then remove the directories it created."""
        self.releases.close()
        self.created_dirs.close()

    def keep_dirs(self) -> None:
        """Start-up succeeded: the directories it made stay."""
        self.created_dirs.pop_all()
