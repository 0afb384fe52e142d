"""The shared-memory arena behind the host tier.

One file in ``/dev/shm`` (tmpfs), created by the daemon with owner-only permissions and mapped by every local
client, so that a chunk moves with one memcpy each way and a get is a zero-copy view. Its pages are allocated
up front with ``posix_fallocate``: tmpfs overcommits, and a write to a page that tmpfs cannot back kills the
writer with SIGBUS — failing at start with a clear message is better than failing mid-put. Allocating up front
also means clients only take minor faults on first touch. Clients map lazily, so that connect does not grow
with the arena, and populate the slots a request touches (``kvstore/client/pages.py``).

The file name is derived from the socket path, so a daemon restarted on the same socket finds and removes the
segment a crashed predecessor left behind.
"""

from __future__ import annotations

import errno
import mmap
import os
from dataclasses import dataclass

import xxhash

from ..errors import ConfigError

SHM_DIR = "/dev/shm"


def arena_path_for(socket_path: str) -> str:
    digest = xxhash.xxh64_hexdigest(os.path.abspath(socket_path).encode())
    return os.path.join(SHM_DIR, f"kvstore.{os.getuid()}.{digest}.arena")


@dataclass
class SharedArena:
    """A mapped shared-memory file. The daemon creates and unlinks it; clients only map it."""

    path: str
    size: int
    buf: mmap.mmap
    owner: bool

    @classmethod
    def create(cls, path: str, size: int) -> "SharedArena":
        """Create a fresh segment, replacing a stale one left by a crashed daemon (the caller holds the lock)."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # regardless of umask
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                os.unlink(path)
                if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                    free = os.statvfs(SHM_DIR)
                    raise ConfigError(
                        f"host tier of {size} bytes does not fit in {SHM_DIR} "
                        f"({free.f_bavail * free.f_frsize} bytes free); lower --host-mem or enlarge {SHM_DIR}"
                    ) from exc
                raise
            buf = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(path=path, size=size, buf=buf, owner=True)

    @classmethod
    def attach(cls, path: str, size: int) -> "SharedArena":
        """Map an existing segment (client side)."""
        fd = os.open(path, os.O_RDWR)
        try:
            actual = os.fstat(fd).st_size
            if actual < size:
                raise OSError(errno.EINVAL, f"shared arena {path} is {actual} bytes, expected {size}")
            buf = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(path=path, size=size, buf=buf, owner=False)

    def view(self) -> memoryview:
        return memoryview(self.buf)

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:
            pass  # views still exported; the mapping goes with the process
        if self.owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
