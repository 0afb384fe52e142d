"""The shared-memory arena behind the host tier.

One file in ``/dev/shm`` (tmpfs), created by the daemon with owner-only permissions and mapped by every local
client, so that a chunk moves with one memcpy each way and a get is a zero-copy view. Its pages are allocated
up front with ``posix_fallocate``: tmpfs overcommits, and a write to a page that tmpfs cannot back kills the
writer with SIGBUS — failing at start with a clear message is better than failing mid-put. Allocating up front
also means clients only take minor faults on first touch. Clients map lazily, so that connect does not grow
with the arena, and populate the slots a request touches (``kvstore/client/pages.py``).

A client maps the file twice: read-write, for the slots it is lent to fill (a put's reservation or credit), and
read-only, for everything it hands its callers to read (a get's views, ``Client.read``'s). A view of the read-only
mapping cannot change the stored bytes by any route: a Python write raises, numpy refuses to make it writable,
and a tensor made from it (torch ignores the flag) faults on its first write instead of changing the chunk every
other reader sees.

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
    """A mapped shared-memory file. The daemon creates and unlinks it; clients only map it.

    ``buf`` is the read-write mapping; ``read_buf`` (clients only) the read-only one readers are given."""

    path: str
    size: int
    buf: mmap.mmap
    owner: bool
    read_buf: mmap.mmap | None = None

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
            # ACCESS_READ (not just PROT_READ): its memoryviews are read-only too, not only its pages
            read_buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        return cls(path=path, size=size, buf=buf, owner=False, read_buf=read_buf)

    def view(self) -> memoryview:
        """The read-write mapping: for slots being filled, never for readers."""
        return memoryview(self.buf)

    def read_view(self) -> memoryview:
        """A read-only view of the read-only mapping (a client's); of the read-write one where there is none."""
        return memoryview(self.read_buf if self.read_buf is not None else self.buf).toreadonly()

    def close(self) -> None:
        for buf in (self.buf, self.read_buf):
            try:
                if buf is not None:
                    buf.close()
            except BufferError:
                pass  # views still exported; the mapping goes with the process
        if self.owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
