"""The shared-memory arena behind the host tier.

One file in ``/dev/shm`` (tmpfs), created by the daemon with owner-only permissions and mapped by every local
client, so that a chunk moves with one memcpy each way and a get is a zero-copy view. Clients map lazily, so that
connect does not grow with the arena, and populate the slots a request touches (``kvstore/client/pages.py``).

Reserving the pages. tmpfs overcommits: a write to a page that tmpfs cannot back kills the writer with SIGBUS.
So no byte is written where the file has no pages reserved: the host tier reserves (``posix_fallocate``) each
``GRANULE`` of the file the first time its allocator hands out an extent that reaches into it (``reserve``), and
a reservation that fails — ``/dev/shm`` is full — is a full tier (the put gets StoreFullError), never a SIGBUS.
The arena therefore takes memory as chunks arrive, up to its size, instead of all of it at start; reserved
granules stay reserved until the daemon stops (freed slots are reused, never given back). Where the GPU tier
page-locks the whole arena at start (``reserve_all``), every page is reserved up front instead, as before: a
failure then is a start-up error.

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
from dataclasses import dataclass, field

import xxhash

from ...errors import ConfigError

SHM_DIR = "/dev/shm"
GRANULE = 2 << 20   # bytes reserved at a time: a huge page, so a put of small chunks costs few system calls


def shm_free() -> int:
    """Bytes free in ``SHM_DIR`` now."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def arena_path_for(socket_path: str) -> str:
    digest = xxhash.xxh64_hexdigest(os.path.abspath(socket_path).encode())
    return os.path.join(SHM_DIR, f"kvstore.{os.getuid()}.{digest}.arena")


@dataclass
class SharedArena:
    """A mapped shared-memory file. The daemon creates and unlinks it (and reserves its pages); clients only map
    it.

    ``buf`` is the read-write mapping; ``read_buf`` (clients only) the read-only one readers are given."""

    path: str
    size: int
    buf: mmap.mmap
    owner: bool
    read_buf: mmap.mmap | None = None
    fd: int = -1                 # the daemon's: what ``reserve`` allocates through
    reserved: bytearray = field(default_factory=bytearray)   # one byte per GRANULE: 1 once reserved

    @classmethod
    def create(cls, path: str, size: int, reserve_all: bool = False) -> "SharedArena":
        """Create a fresh segment, replacing a stale one left by a crashed daemon (the caller holds the lock).
        ``reserve_all``: reserve every page now (a ConfigError when they do not fit), else as ``reserve`` asks."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # regardless of umask
            os.ftruncate(fd, size)
            arena = cls(path=path, size=size, buf=mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                                                            prot=mmap.PROT_READ | mmap.PROT_WRITE),
                        owner=True, fd=fd, reserved=bytearray(-(-size // GRANULE)))
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        if reserve_all and not arena.reserve(0, size):
            arena.close()
            raise ConfigError(f"host tier of {size} bytes does not fit in {SHM_DIR} ({shm_free()} bytes free); "
                              f"lower --host-mem or enlarge {SHM_DIR}")
        return arena

    def reserve(self, offset: int, nbytes: int) -> bool:
        """Back ``[offset, offset + nbytes)`` with pages (the granules around it not reserved yet); False when
        the file system has no room for them (nothing may be written there then)."""
        first, end = offset // GRANULE, -(-(offset + nbytes) // GRANULE)
        at = self.reserved.find(0, first, end)
        while at >= 0:
            stop = self.reserved.find(1, at, end)
            stop = end if stop < 0 else stop
            start, length = at * GRANULE, min(stop * GRANULE, self.size) - at * GRANULE
            try:
                os.posix_fallocate(self.fd, start, length)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                    return False
                raise
            self.reserved[at:stop] = b"\x01" * (stop - at)
            at = self.reserved.find(0, stop, end)
        return True

    @property
    def reserved_bytes(self) -> int:
        """Bytes of the file backed by pages so far."""
        count = self.reserved.count(1)
        if count and self.reserved[-1]:
            count -= 1
            return count * GRANULE + (self.size - (len(self.reserved) - 1) * GRANULE)
        return count * GRANULE

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
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
