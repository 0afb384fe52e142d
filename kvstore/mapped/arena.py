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

The file name is derived from the socket path, so a daemon restarted on the same socket finds the segment its
predecessor left behind: it adopts it (``open_kept``: a warm restart, ``adoption.py``) or removes it.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from dataclasses import dataclass, field

import xxhash

from ..errors import ConfigError

SHM_DIR = "/dev/shm"
GRANULE = 2 << 20   # bytes reserved at a time: a huge page, so a put of small chunks costs few system calls
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)   # Linux's value; Python names it from 3.12


def shm_free() -> int:
    """Bytes free in ``SHM_DIR`` now."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def arena_path_for(socket_path: str) -> str:
    digest = xxhash.xxh64_hexdigest(os.path.abspath(socket_path).encode())
    return os.path.join(SHM_DIR, f"kvstore.{os.getuid()}.{digest}.arena")


def held_by_arena_of(socket_path: str) -> int:
    """Bytes of memory the arena file of the daemon on ``socket_path`` holds now (0: there is none)."""
    try:
        st = os.stat(arena_path_for(socket_path))
    except OSError:
        return 0
    return st.st_blocks * 512 if st.st_uid == os.getuid() else 0


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
            arena = cls._owned(path, fd, size, bytearray(-(-size // GRANULE)))
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        return arena._reserved_whole() if reserve_all else arena

    @classmethod
    def open_kept(cls, path: str, size: int, reserve_all: bool = False) -> "SharedArena | None":
        """Map the segment a stopped daemon kept (``close(keep=True)``), as ``size`` bytes: a larger size
        grows the file, a smaller one frees the pages past it but keeps the file's length, so that a client still
        mapping it from before reads zeros there rather than faulting; None when there is none. The granules
        that hold pages count as reserved.
        Raises ConfigError when the file is not one this user's daemon made (then it is left alone)."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot open the kept arena {path}: {exc.strerror}; remove it with "
                              f"kvstore clean --socket and this daemon's socket") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise ConfigError(f"{path} is not an arena this user's daemon kept (owner {st.st_uid}, mode "
                                  f"{stat.S_IMODE(st.st_mode):o}); remove it or choose another --socket")
            if st.st_size > size:
                _free_past(fd, size, st.st_size)
            else:
                os.ftruncate(fd, size)
            arena = cls._owned(path, fd, size, _granules_with_pages(fd, size))
        except BaseException:
            os.close(fd)
            raise
        return arena._reserved_whole() if reserve_all else arena

    @classmethod
    def _owned(cls, path: str, fd: int, size: int, reserved: bytearray) -> "SharedArena":
        """The daemon's read-write shared mapping of the segment open at ``fd``."""
        buf = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(path=path, size=size, buf=buf, owner=True, fd=fd, reserved=reserved)

    def _reserved_whole(self) -> "SharedArena":
        """This arena with every page reserved now; closed, and a ConfigError, when they do not fit."""
        if not self.reserve(0, self.size):
            self.close()
            raise ConfigError(f"host tier of {self.size} bytes does not fit in {SHM_DIR} ({shm_free()} bytes "
                              f"free); lower --host-mem or enlarge {SHM_DIR}")
        return self

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

    def populate(self, offset: int, nbytes: int) -> None:
        """Map the pages of ``[offset, offset + nbytes)`` in one call (``MADV_POPULATE_READ``) before they are read
        through, rather than one fault per page; a kernel without it (before Linux 5.14) faults them as usual."""
        start = offset - offset % mmap.PAGESIZE
        try:
            self.buf.madvise(MADV_POPULATE_READ, start, min(self.size, offset + nbytes) - start)
        except (OSError, ValueError):
            pass

    def view(self) -> memoryview:
        """The read-write mapping: for slots being filled, never for readers."""
        return memoryview(self.buf)

    def read_view(self) -> memoryview:
        """A read-only view of the read-only mapping (a client's); of the read-write one where there is none."""
        return memoryview(self.read_buf if self.read_buf is not None else self.buf).toreadonly()

    def close(self, keep: bool = False) -> None:
        """Unmap; the daemon also removes the file, unless ``keep`` (a warm restart adopts it)."""
        for buf in (self.buf, self.read_buf):
            try:
                if buf is not None:
                    buf.close()
            except BufferError:
                pass  # views still exported; the mapping goes with the process
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.owner and not keep:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _granules_with_pages(fd: int, size: int) -> bytearray:
    """One byte per GRANULE of the file: 1 where tmpfs holds pages (found with SEEK_DATA / SEEK_HOLE)."""
    marks = bytearray(-(-size // GRANULE))
    at = 0
    while at < size:
        try:
            data = os.lseek(fd, at, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break   # no data past ``at``
            raise
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), size)
        marks[data // GRANULE: -(-hole // GRANULE)] = b"\x01" * (-(-hole // GRANULE) - data // GRANULE)
        at = hole
    return marks


def _free_past(fd: int, size: int, file_size: int) -> None:
    """Give back the pages of ``[size, file_size)`` (rounded up to a page) without shortening the file."""
    start = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
    if start >= file_size:
        return
    whole = mmap.mmap(fd, file_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        whole.madvise(mmap.MADV_REMOVE, start, file_size - start)
    finally:
        whole.close()
