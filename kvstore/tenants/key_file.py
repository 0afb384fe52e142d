"""The daemon's tenant key file: the secret that makes restricted tenants' key spaces (``key_space.py``).

The secret is ``SECRET_BYTES`` random bytes in a file the daemon creates once (mode 0600, ``O_EXCL``: two daemons
starting together keep the one that was made first) and reads at every start, so chunks kept across a restart
(disk files, the kept arena, the journal, the remote store: all named by the Store's keys) stay reachable.
Daemons that share one remote store must use the same file for their restricted tenants to share chunks there.

It is read (or made) only when the tenants table has a restricted tenant: a host without identities in its table
gets no new file. Where: ``--tenant-key-file``, else ``tenant-keys.secret`` in ``--disk-dir``.

A file the daemon cannot trust refuses the start (or the reload that first needs it) in one line naming it:
not exactly ``SECRET_BYTES`` bytes, readable or writable by group or others, not owned by the daemon's user, or
not a regular file.
"""

from __future__ import annotations

import errno
import os
import stat

from .. import logs
from ..config import ServerConfig
from ..errors import ConfigError
from ..security.paths import make_private_dirs
from .key_space import SECRET_BYTES, TenantKeys, needs_key_spaces
from .table import TenantTable

DEFAULT_NAME = "tenant-keys.secret"
FLAG = "--tenant-key-file"


def key_file_path(config: ServerConfig) -> str:
    """The tenant key file ``config`` names: ``tenant_key_file``, else ``tenant-keys.secret`` in ``disk_dir``."""
    return config.tenant_key_file or os.path.join(config.disk_dir, DEFAULT_NAME)


def open_tenant_keys(config: ServerConfig, table: TenantTable | None) -> TenantKeys | None:
    """The key spaces ``table`` needs: None when it has no restricted tenant (no file is read or made).

    Raises:
        ConfigError: the key file cannot be made, or is not one the daemon can trust (one line, naming it).
    """
    if not needs_key_spaces(table):
        return None
    return TenantKeys(read_or_create_secret(key_file_path(config)))


def read_or_create_secret(path: str) -> bytes:
    """The secret in ``path``, made (``SECRET_BYTES`` random bytes, mode 0600) if there is no file there.

    Raises:
        ConfigError: it cannot be made or read, or it is not a file the daemon can trust.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)   # a FIFO must not block
    except FileNotFoundError:
        return _create(path)
    except OSError as exc:
        raise ConfigError(f"{FLAG}: cannot read {path}: {_reason(exc)}; {_fix(path)}") from None
    try:
        _check(path, os.fstat(fd))
        secret = os.read(fd, SECRET_BYTES + 1)
    finally:
        os.close(fd)
    _check_size(path, len(secret))
    return secret


def _check(path: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{FLAG}: {path} is not a regular file; {_fix(path)}")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{FLAG}: {path} is owned by uid {st.st_uid}, not by the daemon's user (uid "
                          f"{os.geteuid()}); chown it to that user, or give another {FLAG}")
    if st.st_mode & 0o077:
        raise ConfigError(f"{FLAG}: {path} is open to group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                          f"it holds the tenants' key secret: chmod 600 {path}")
    _check_size(path, st.st_size)


def _check_size(path: str, size: int) -> None:
    if size != SECRET_BYTES:
        raise ConfigError(f"{FLAG}: {path} holds {size} bytes, not {SECRET_BYTES}: it is not a tenant key "
                          f"file; restore the right one (a copy of the file of the daemons sharing the remote "
                          f"store), or remove it to make a new one (restricted tenants' stored chunks are then lost)")


def _create(path: str) -> bytes:
    try:
        make_private_dirs(os.path.dirname(path) or ".")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return read_or_create_secret(path)   # another daemon made it first: its secret is the one
    except OSError as exc:
        raise ConfigError(f"{FLAG}: cannot create {path}: {_reason(exc)}; {_fix(path)}") from None
    secret = os.urandom(SECRET_BYTES)
    try:
        try:
            os.write(fd, secret)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        os.unlink(path)   # never leave a short file that would refuse every later start
        raise ConfigError(f"{FLAG}: cannot write {path}: {_reason(exc)}; {_fix(path)}") from None
    logs.info("tenant_key_file_created", path=path)
    return secret


def _reason(exc: OSError) -> str:
    return "it is a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))


def _fix(path: str) -> str:
    return f"give {FLAG} a path the daemon's user may create and read, or fix {path}"
