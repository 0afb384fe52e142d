"""Disk (NVMe) tier: one file per chunk under a fan-out directory, moved with O_DIRECT where possible.

Naming. A chunk lives at ``DIR/ab/<32 hex digits of its key>.kv``, ``ab`` being the first two hex digits (256
directories keep each one small). The name comes only from the validated 16-byte key, never from a wire string,
so no request can name a path. A write goes to ``<name>.tmp.<pid>.<n>`` and is renamed over the final name when
complete: a reader or a restart never sees a half-written chunk, and temporaries left by a crash are removed at
start.

I/O. Every method here that touches a file is blocking and runs on the disk mover's thread pool, several at
once so that the device queue stays full; none runs on the event loop. The payload sits block-aligned after a
4 KiB header (see ``format.py``) and the host arena's slots are page-aligned and page-rounded, so with
``O_DIRECT`` one ``pwritev``/``preadv`` moves a chunk between the device and its arena slot with no staging
copy and without polluting the page cache. Filesystems that refuse ``O_DIRECT`` (tmpfs on old kernels, some
FUSE and network filesystems) are detected once at start and served with buffered I/O instead.

Accounting (``used_bytes``, ``charge``/``uncharge``) is done by the store on the event loop, so that the cap is
enforced before a write starts; a file is charged at its size rounded up to a 4 KiB block.

Start-up. ``scan`` reads the 4 KiB header of every file (in parallel, one directory per task) and returns the
valid ones; files whose header is bad, whose length disagrees with the header or whose name disagrees with the
key inside are moved to ``DIR/quarantine/`` and reported; files that are not ours are left alone and reported.
Payload checksums are checked on every read instead of at start, which keeps the rebuild at header speed.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import lz4.block

from ...binding import rebind
from ...errors import ConfigError
from ...errors import ChecksumError, DamagedSource
from ...protocol.engine_blocks import EngineBlocks
from ...protocol.key_params import KeyParams
from ...protocol.retention import Retention
from .format import FLAG_LZ4, FLAG_RAW_SUM, HEADER_BYTES, ChunkHeader, FormatError, checksum, pack_header, unpack_header

BLOCK = 4096
QUARANTINE = "quarantine"
_CHUNK_NAME = re.compile(r"^[0-9a-f]{32}\.kv$")
_TEMP_NAME = re.compile(r"^[0-9a-f]{32}\.kv\.tmp\.")
_FANOUT_NAME = re.compile(r"^[0-9a-f]{2}$")


def round_up(n: int, to: int = BLOCK) -> int:
    return -(-n // to) * to


@dataclass
class ScanResult:
    chunks: list[tuple[ChunkHeader, int]] = field(default_factory=list)   # (header, mtime_ns)
    quarantined: list[tuple[str, str]] = field(default_factory=list)      # (file name, reason)
    renamed: int = 0   # files named by their key as sent (written before keys were bound), renamed
    to_rename: list[tuple[str, ChunkHeader, int]] = field(default_factory=list)   # (path, header, mtime_ns)
    foreign: list[str] = field(default_factory=list)
    temps_removed: int = 0


class _Scratch(threading.local):
    """Per-thread page-aligned buffers (anonymous mappings are page-aligned, as O_DIRECT needs)."""

    def __init__(self) -> None:
        self.header = mmap.mmap(-1, HEADER_BYTES)
        self.data: mmap.mmap | None = None

    def data_view(self, nbytes: int) -> memoryview:
        if self.data is None or len(self.data) < nbytes:
            if self.data is not None:
                self.data.close()
            self.data = mmap.mmap(-1, round_up(max(nbytes, 1 << 20)))
        return memoryview(self.data)[:nbytes]


class DiskTier:
    name = "disk"

    def __init__(self, directory: str, capacity_bytes: int, compress: bool = False) -> None:
        self.directory = os.path.abspath(directory)
        self.capacity_bytes = capacity_bytes
        self.compress = compress
        self.used_bytes = 0
        self.chunks = 0
        self._scratch = _Scratch()
        self._temp_ids = itertools.count()
        self._prepare()
        self.direct = self._probe_direct()

    # -- accounting (event loop) -----------------------------------------------------------------------------
    @staticmethod
    def footprint(stored_len: int) -> int:
        """Bytes a chunk file takes, header included, rounded to blocks."""
        return HEADER_BYTES + round_up(stored_len)

    def charge(self, nbytes: int) -> bool:
        if self.used_bytes + nbytes > self.capacity_bytes:
            return False
        self.used_bytes += nbytes
        self.chunks += 1
        return True

    def uncharge(self, nbytes: int) -> None:
        self.used_bytes -= nbytes
        self.chunks -= 1

    # -- paths ----------------------------------------------------------------------------------------------
    def path_for(self, key: bytes) -> str:
        if len(key) != 16:
            raise ValueError("a chunk key is 16 bytes")
        name = key.hex()
        return os.path.join(self.directory, name[:2], name + ".kv")

    def _prepare(self) -> None:
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--disk-dir: cannot create {self.directory}: {exc.strerror}") from None
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise ConfigError(f"--disk-dir: {self.directory} is not writable; choose another --disk-dir")

    def _probe_direct(self) -> bool:
        probe = os.path.join(self.directory, f".direct-probe.{os.getpid()}")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o600)
        except OSError:
            return False
        try:
            os.pwrite(fd, self._scratch.header, 0)
            return hasattr(os, "O_DIRECT")
        except OSError:
            return False
        finally:
            os.close(fd)
            os.unlink(probe)

    def _flags(self) -> int:
        return os.O_DIRECT if self.direct else 0

    # -- file I/O (worker threads) ---------------------------------------------------------------------------
    def write(self, key: bytes, namespace: str, slot: memoryview, size: int, expected: int | None = None,
              parent: bytes | None = None, engine: EngineBlocks | None = None,
              retention: Retention = Retention.NORMAL, params: KeyParams | None = None) -> int:
        """Write the chunk whose bytes are ``slot[:size]`` (``slot`` page-aligned, ``len(slot)`` rounded up to a
        block). ``expected`` is the chunk's checksum: the slot is checked against it on the way (DamagedSource
        when it differs: the DRAM copy changed since commit) and it is the sum the header carries. Returns the
        stored payload length. Raises OSError (ENOSPC, EIO, ...)."""
        raw_sum = checksum(slot[:size])
        if expected is not None and raw_sum != expected:
            raise DamagedSource(f"chunk {key.hex()} in DRAM no longer matches its checksum")
        payload, flags = slot, 0
        if self.compress:
            packed = lz4.block.compress(slot[:size], store_size=False)
            if len(packed) < size:
                payload = self._scratch.data_view(round_up(len(packed)))
                payload[:len(packed)] = packed
                flags = FLAG_LZ4 | FLAG_RAW_SUM
                stored = len(packed)
        if not flags:
            stored = size
            if len(slot) % BLOCK or len(slot) < size:
                raise ValueError("slot must be block-rounded and hold the chunk")
        header = ChunkHeader(key, namespace, size, stored, raw_sum, flags, parent, engine, retention, params)
        block = memoryview(self._scratch.header)
        pack_header(header, block)
        final = self.path_for(key)
        os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
        temp = f"{final}.tmp.{os.getpid()}.{next(self._temp_ids)}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | self._flags(), 0o600)
        try:
            self._pwrite_all(fd, [block, payload[:round_up(stored)]])
            os.ftruncate(fd, header.file_len)
        except BaseException:
            os.close(fd)
            os.unlink(temp)
            raise
        os.close(fd)
        os.rename(temp, final)
        return stored

    @staticmethod
    def _pwrite_all(fd: int, buffers: list[memoryview]) -> None:
        offset = 0
        views = [memoryview(b).cast("B") for b in buffers]
        while views:
            n = os.pwritev(fd, views, offset)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            offset += n
            while views and n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            if views and n:
                views[0] = views[0][n:]

    def read_into(self, key: bytes, slot: memoryview, size: int) -> int:
        """Read the chunk into ``slot[:size]`` (page-aligned, block-rounded), verify it and return its checksum.

        Raises FileNotFoundError, FormatError (header or length wrong), ChecksumError, or another OSError.
        """
        block = memoryview(self._scratch.header)
        fd = os.open(self.path_for(key), os.O_RDONLY | self._flags())
        try:
            file_len = os.fstat(fd).st_size
            got = os.preadv(fd, [block, slot], 0)
        finally:
            os.close(fd)
        header = unpack_header(block, file_len)
        if header.key != key or header.raw_len != size or got < header.file_len:
            raise FormatError(f"file holds key {header.key.hex()} of {header.raw_len} bytes; expected "
                              f"{key.hex()} of {size} bytes")
        if not header.raw_sum and checksum(slot[:header.stored_len]) != header.payload_sum:
            raise ChecksumError(f"payload checksum mismatch in {self.path_for(key)}")
        if header.compressed:
            packed = bytes(slot[:header.stored_len])
            try:
                slot[:size] = lz4.block.decompress(packed, uncompressed_size=size)
            except lz4.block.LZ4BlockError as exc:
                raise ChecksumError(f"cannot decompress {self.path_for(key)}: {exc}") from None
        raw_sum = checksum(slot[:size])   # the one pass, unless a file from before FLAG_RAW_SUM
        if header.raw_sum and raw_sum != header.payload_sum:
            raise ChecksumError(f"payload checksum mismatch in {self.path_for(key)}")
        return raw_sum

    def verify(self, key: bytes, size: int) -> int:
        """Read and check the chunk's file into this thread's scratch buffer (a scrub); returns its checksum."""
        return self.read_into(key, self._scratch.data_view(round_up(size)), size)

    def remove(self, key: bytes) -> None:
        try:
            os.unlink(self.path_for(key))
        except FileNotFoundError:
            pass

    def quarantine(self, key: bytes, reason: str) -> None:
        self._quarantine_path(self.path_for(key), reason)

    def _quarantine_path(self, path: str, reason: str) -> None:
        qdir = os.path.join(self.directory, QUARANTINE)
        try:
            os.makedirs(qdir, mode=0o700, exist_ok=True)
            os.rename(path, os.path.join(qdir, os.path.basename(path)))
        except FileNotFoundError:
            pass
        except OSError:
            try:
                os.unlink(path)
            except OSError:
                pass

    # -- start-up -------------------------------------------------------------------------------------------
    def scan(self, workers: int = 8) -> ScanResult:
        """Read every chunk header; quarantine bad files, remove temporaries, report foreign files."""
        result = ScanResult()
        subdirs = []
        for entry in os.scandir(self.directory):
            if entry.is_dir(follow_symlinks=False) and _FANOUT_NAME.match(entry.name):
                subdirs.append(entry.path)
            elif entry.name not in (QUARANTINE, ".lock") and not entry.name.startswith(".direct-probe."):
                result.foreign.append(entry.name)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for part in pool.map(self._scan_dir, subdirs):
                result.chunks += part.chunks
                result.quarantined += part.quarantined
                result.foreign += part.foreign
                result.temps_removed += part.temps_removed
                result.to_rename += part.to_rename
        for path, header, mtime in result.to_rename:
            reason = self._rename_to_bound(path, header.key)
            if reason is None:
                result.chunks.append((header, mtime))
                result.renamed += 1
            else:
                self._quarantine_path(path, reason)
                result.quarantined.append((os.path.basename(path), reason))
        result.to_rename = []
        return result

    def _rename_to_bound(self, path: str, key: bytes) -> str | None:
        """Rename a chunk file named by its key as sent to the name of its bound key; None, or why it failed."""
        target = self.path_for(key)
        try:
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            if os.path.exists(target):
                return "a file of its bound key exists already"
            os.rename(path, target)
        except OSError as exc:
            return f"cannot rename it to its bound key: {exc.strerror}"
        return None

    def _scan_dir(self, path: str) -> ScanResult:
        result = ScanResult()
        with os.scandir(path) as it:
            entries = list(it)
        for entry in entries:
            name = entry.name
            if _TEMP_NAME.match(name):
                try:
                    os.unlink(entry.path)
                    result.temps_removed += 1
                except OSError:
                    pass
            elif not _CHUNK_NAME.match(name) or not entry.is_file(follow_symlinks=False):
                result.foreign.append(os.path.join(os.path.basename(path), name))
            else:
                reason = self._check_file(entry.path, name, result)
                if reason is not None:
                    self._quarantine_path(entry.path, reason)
                    result.quarantined.append((name, reason))
        return result

    @staticmethod
    def _check_file(path: str, name: str, result: ScanResult) -> str | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            return f"cannot open: {exc.strerror}"
        try:
            st = os.fstat(fd)
            block = os.pread(fd, HEADER_BYTES, 0)
        except OSError as exc:
            return f"cannot read: {exc.strerror}"
        finally:
            os.close(fd)
        try:
            header = unpack_header(block, st.st_size)
        except FormatError as exc:
            return str(exc)
        if header.key.hex() + ".kv" != name:
            if rebind(header.namespace, header.key).hex() + ".kv" != name:   # nor the key as its client sent it
                return "file name does not match the key in its header"
            # Named by the key as sent: written before keys were bound (kvstore/binding.py). Renamed once every
            # folder is scanned, so that no scan meets it twice.
            result.to_rename.append((path, header, st.st_mtime_ns))
            return None
        result.chunks.append((header, st.st_mtime_ns))
        return None


def existing_parent(directory: str) -> str:
    """``directory`` or its nearest existing parent: where its filesystem can be asked about."""
    probe = os.path.abspath(directory)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    return probe


FANOUT_DIRS = 256            # the ab/ directories, a block each on most filesystems
HEADROOM_SHARE = 100        # and 1 % of the filesystem for inodes, metadata and temporaries...
HEADROOM_MAX = 1 << 30      # ... at most 1 GiB
AUTO_SHARE = 10             # auto: a tenth of what the tier could use...
AUTO_MAX = 64 << 30         # ... at most 64 GiB


@dataclass(frozen=True)
class DiskRoom:
    """What the disk tier can use on its filesystem: the free space plus what its own files take already (a
    restart must not shrink the tier by its own contents), less headroom for directories and file overheads."""

    free: int
    held: int
    headroom: int
    total: int

    @property
    def usable(self) -> int:
        return max(0, self.free + self.held - self.headroom)

    def auto_size(self) -> int:
        """``--disk-size auto``: a tenth of what the tier could use, at most 64 GiB, in whole MiB."""
        return min(AUTO_MAX, self.usable // AUTO_SHARE) >> 20 << 20


def disk_room(directory: str) -> DiskRoom:
    """Measure the filesystem that holds (or will hold) ``directory``, and the chunk files already in it."""
    usage = shutil.disk_usage(existing_parent(directory))
    headroom = FANOUT_DIRS * BLOCK + min(usage.total // HEADROOM_SHARE, HEADROOM_MAX)
    return DiskRoom(usage.free, held_bytes(directory), headroom, usage.total)


def held_bytes(directory: str) -> int:
    """Bytes the chunk files (and temporaries) under ``directory``'s fan-out directories take on the device."""
    held = 0
    try:
        fanout = [e for e in os.scandir(directory) if e.is_dir(follow_symlinks=False) and _FANOUT_NAME.match(e.name)]
    except OSError:
        return 0
    for folder in fanout:
        try:
            with os.scandir(folder.path) as files:
                for f in files:
                    if f.is_file(follow_symlinks=False):
                        held += f.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            continue
    return held
