"""Crash adoption: a journal of the DRAM tier's committed slots, written as they change, that survives SIGKILL.

A clean stop describes the arena it keeps (``description.py``); a crash (SIGKILL, the OOM killer, a fault) writes
nothing. So that the next daemon can still adopt what it can prove, the daemon appends to a small file beside the
arena in ``/dev/shm`` (``<arena>.journal``, owner-only) a record per change of a slot's identity:

- COMMIT (a chunk's key, offset, size, namespace, parent, checksum and engine names): written once the chunk's
  checksum is known (``Store.checksummed``, after the commit's hash on the worker), when a promotion or a fetch
  fills a slot with a chunk whose checksum is known (``Store.fill_host``, ``Store.admit``), and when an adopted
  chunk is published;
- FREE (an offset): written for every slot the host tier frees (``HostTier.free``), whatever freed it, and at
  once when a chunk is deleted or dropped as damaged (``Store.remove_committed``), even while a reader still
  holds its slot.

Records are appended with ``write(2)`` to a tmpfs file, so they are in the page cache the moment the call returns
and outlive the process however it dies (not a reboot, which takes the arena too). Each record carries its own
xxh3 checksum: a record torn by a death inside the call is detected, and the journal ends there.

Why a COMMIT never names bytes that are not final: it is written after the chunk was committed (its writer is
done) and after its checksum was taken from those bytes, while the chunk still holds the slot (a chunk that left
its slot meanwhile gets no record: ``Store.checksummed`` only hears of live chunks).

Why a freed slot is never adopted with its old chunk's identity: FREE records are buffered, but the buffer is
written out before the host tier hands any slot out (``HostTier.allocate`` flushes before it returns an offset;
every writer's space, a reservation's or a put credit's, comes from there). So by the time another chunk's bytes
can be written into a freed slot, the journal already says the slot is free, and replaying it drops the old
COMMIT. A new chunk of the same size in the same slot whose COMMIT was lost (torn, or never written because its
checksum was still being taken) is simply not adopted: the latest valid record for the slot is the FREE. And
were a stale COMMIT ever replayed over other bytes, the checksum check every adopted chunk goes through drops it
(or, if the bytes are identical, what is served under the key is exactly what was committed under it).

What never survives a crash: reservations and half-written puts (never journaled), put credits, leases (the
journal does not follow gets: a reader of the killed daemon that still reads a view after the next daemon has
started and reused the slot may see other bytes; readers normally release within a get's copy, well under a
daemon's start), and chunks whose checksum was still being taken.

Cost: appending COMMITs is one ``write(2)`` per batch of checksums (one per put), off the put's reply; a FREE is a
few bytes appended to a buffer, flushed with the next allocation (one more ``write(2)`` per put that evicted).
The file is compacted (rewritten with the live COMMITs, renamed over) when it grows past ``COMPACT_FACTOR``
times what is live, so it stays proportional to the chunks in DRAM. Should a write fail (``/dev/shm`` full), the
journal is removed and stays off: a crash then adopts nothing, never something unproven.

Layout: header ``magic b"KVSJRNL\\0", version u32, socket length u32, socket (utf-8)``, then records
``kind u8, 3 bytes 0, body length u32, xxh3-64 of the body u64, body`` (COMMIT: the msgpack list of
``description.py``'s chunk; FREE: the offset, u64), little endian. Version 2 added the chunk's retention class to
COMMIT records (as the description's version 2 did); a chunk whose class changes while it holds its slot gets a
COMMIT again (``RetentionClasses.reclass``, ``store/classes.py``). Version 3 added the key parameters of the chunk's
namespace (as the description's version 3 did). This daemon reads versions 1 (every chunk ``normal``), 2 and 3,
and writes 3.
"""

from __future__ import annotations

import glob
import os
import struct
from dataclasses import dataclass, field
from typing import Sequence

import msgpack
import xxhash

from ... import logs
from .description import DescriptionError, KeptChunk, pack_chunk, unpack_chunk

MAGIC = b"KVSJRNL\0"
FORMAT_VERSION = 3          # what is written: COMMIT records carry the chunk's class (2) and key parameters (3)
READ_VERSIONS = (1, 2, 3)   # what is read (version 1 COMMITs have no class: normal; before 3, no parameters)
SUFFIX = ".journal"
_HEADER = struct.Struct("<8sII")
_RECORD = struct.Struct("<B3xIQ")
_OFFSET = struct.Struct("<Q")
COMMIT, FREE = 1, 2
COMPACT_FACTOR = 4          # rewrite once the file holds this many times the live records' bytes
COMPACT_SLACK = 1 << 20     # ... and at least this much more (a small journal is never rewritten)
MAX_SOCKET = 4096


class JournalError(Exception):
    """The journal beside a killed daemon's arena cannot be used (its message says why, in one line)."""


def journal_path_for(arena_path: str) -> str:
    return arena_path + SUFFIX


@dataclass
class SlotJournal:
    """The one writer of an arena's journal (see the module doc). Not thread-safe: the event loop calls it."""

    path: str
    socket: str
    fd: int = -1
    size: int = 0                                             # bytes in the file (written)
    live: dict[int, bytes] = field(default_factory=dict)      # offset → its COMMIT record, oldest first
    live_bytes: int = 0
    pending: bytearray = field(default_factory=bytearray)     # records not written yet
    compactions: int = 0

    @classmethod
    def create(cls, path: str, socket: str) -> "SlotJournal":
        """A fresh, empty journal at ``path`` (replacing any). Raises OSError when it cannot be made."""
        journal = cls(path, socket)
        journal.fd, journal.size = _write_fresh(path, _header(socket), [])
        return journal

    @property
    def on(self) -> bool:
        return self.fd >= 0

    def committed(self, chunks: Sequence[KeptChunk]) -> None:
        """Record that each of ``chunks`` now holds its slot with final bytes and checksum; written at once."""
        if not self.on or not chunks:
            return
        for chunk in chunks:
            record = _record(COMMIT, msgpack.packb(pack_chunk(chunk), use_bin_type=True))
            old = self.live.pop(chunk.offset, None)
            self.live_bytes += len(record) - (len(old) if old is not None else 0)
            self.live[chunk.offset] = record
            self.pending += record
        self.flush()

    def freed(self, offset: int) -> None:
        """Record that the slot at ``offset`` is free; written before the host tier hands out any slot."""
        if not self.on:
            return
        old = self.live.pop(offset, None)
        if old is not None:
            self.live_bytes -= len(old)
        self.pending += _record(FREE, _OFFSET.pack(offset))

    def forget(self, offset: int) -> None:
        """Record now that the chunk at ``offset`` is gone (deleted, damaged), though its slot may stay taken until
        its last reader lets go: a crash meanwhile must not bring it back."""
        self.freed(offset)
        self.flush()

    def flush(self) -> None:
        """Write what is pending (one ``write(2)``), compacting the file first when it has grown too large."""
        if not self.on or not self.pending:
            return
        try:
            if self.size + len(self.pending) > COMPACT_FACTOR * self.live_bytes + COMPACT_SLACK:
                self._compact()
            else:
                _write_all(self.fd, self.pending)
                self.size += len(self.pending)
            self.pending.clear()
        except OSError as exc:
            self._turn_off(exc)

    def close(self) -> None:
        """At stop: remove the journal (a clean stop describes the arena instead, or frees it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        _unlink(self.path)

    def _compact(self) -> None:
        """Rewrite the file with the live COMMITs only, renamed over the old one (a death meanwhile leaves one of
        the two whole)."""
        fd, size = _write_fresh(self.path, _header(self.socket), list(self.live.values()))
        os.close(self.fd)
        self.fd, self.size = fd, size
        self.compactions += 1

    def _turn_off(self, exc: OSError) -> None:
        logs.error("journal_off", path=self.path, error=exc.strerror or repr(exc),
                   effect="a crash of this daemon adopts nothing from DRAM")
        self.close()
        self.pending.clear()
        self.live.clear()


@dataclass(frozen=True)
class JournalReplay:
    """What a killed daemon's journal proves: the chunks whose latest record is a COMMIT, in commit order."""

    socket: str
    chunks: list[KeptChunk]
    records: int
    torn: bool          # the file ended inside a record (the daemon died while writing it)


def read_journal(path: str) -> JournalReplay | None:
    """Replay the journal at ``path`` (None: there is none). Raises JournalError naming what is wrong."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalError(f"cannot read {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise JournalError(f"{path} is not a journal this user's daemon wrote (owner {st.st_uid}, mode "
                               f"{st.st_mode & 0o777:o})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    finally:
        os.close(fd)
    socket, at = _parse_header(path, data)
    live: dict[int, KeptChunk] = {}
    records = 0
    while at < len(data):
        if at + _RECORD.size > len(data):
            return JournalReplay(socket, list(live.values()), records, True)
        kind, length, digest = _RECORD.unpack_from(data, at)
        body = data[at + _RECORD.size: at + _RECORD.size + length]
        if len(body) < length or xxhash.xxh3_64_intdigest(body) != digest or kind not in (COMMIT, FREE):
            return JournalReplay(socket, list(live.values()), records, True)
        _apply(live, kind, body, path)
        records += 1
        at += _RECORD.size + length
    return JournalReplay(socket, list(live.values()), records, False)


def read_journal_socket(path: str) -> str | None:
    """The socket named in the header of the journal at ``path`` (None when unreadable): for ``kvstore clean``."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER.size + MAX_SOCKET)
        return _parse_header(path, head)[0]
    except (OSError, JournalError):
        return None


def remove_journal(path: str) -> None:
    """Remove the journal at ``path`` and any rewrite of it a death interrupted."""
    _unlink(path)
    for stale in glob.glob(glob.escape(path) + ".*.tmp"):
        _unlink(stale)


def _apply(live: dict[int, KeptChunk], kind: int, body: bytes, path: str) -> None:
    if kind == FREE:
        (offset,) = _OFFSET.unpack(body)
        live.pop(offset, None)
        return
    try:
        chunk = unpack_chunk(msgpack.unpackb(body, raw=False))
    except (DescriptionError, ValueError, TypeError, msgpack.UnpackException) as exc:
        raise JournalError(f"{path}: a COMMIT record with a sound checksum does not parse ({exc})") from None
    live.pop(chunk.offset, None)   # a COMMIT over a live one (not expected): the later one wins, moved last
    live[chunk.offset] = chunk


def _parse_header(path: str, data: bytes) -> tuple[str, int]:
    if len(data) < _HEADER.size:
        raise JournalError(f"{path} is shorter than a journal's header")
    magic, version, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise JournalError(f"{path} is not a kvstore journal (bad magic)")
    if version not in READ_VERSIONS:
        raise JournalError(f"{path} is format version {version}; this kvstore reads versions "
                           f"{' and '.join(map(str, READ_VERSIONS))}")
    if length > MAX_SOCKET or _HEADER.size + length > len(data):
        raise JournalError(f"{path} has a truncated header")
    try:
        socket = data[_HEADER.size:_HEADER.size + length].decode()
    except UnicodeDecodeError:
        raise JournalError(f"{path} names a socket that is not UTF-8") from None
    return socket, _HEADER.size + length


def _header(socket: str) -> bytes:
    raw = socket.encode()
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(raw)) + raw


def _record(kind: int, body: bytes) -> bytes:
    return _RECORD.pack(kind, len(body), xxhash.xxh3_64_intdigest(body)) + body


def _write_fresh(path: str, header: bytes, records: list[bytes]) -> tuple[int, int]:
    """A new file at ``path`` holding ``header`` and ``records`` (written beside it, renamed over); its fd
    (open for appending) and size."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        data = header + b"".join(records)
        _write_all(fd, data)
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        _unlink(tmp)
        raise
    return fd, len(data)


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
