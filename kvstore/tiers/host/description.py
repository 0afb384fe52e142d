"""What a stopped daemon leaves beside the arena it keeps: which slot holds which chunk (the warm restart's record).

A clean stop writes it (``adoption.describe``) after the last change to the Store and before the arena is
unmapped; the next daemon on the same socket reads it, removes it (it describes the arena only until someone
serves from it again) and adopts what it lists (``adoption.py``). It lives in ``/dev/shm`` next to the arena, so
both go together at a reboot: the record never outlives the memory it describes.

Layout: a fixed header, then one msgpack map::

    offset size field
    0      8    magic        b"KVSKEPT\\0"
    8      4    version      FORMAT_VERSION (u32, little endian)
    12     4    reserved     0
    16     8    length       bytes of the payload that follows
    24     8    payload_sum  xxh3-64 of the payload
    32     …    payload      {"socket", "uid", "arena_size", "written", "chunks": [[key, offset, size, namespace,
                              parent, checksum, leased, engine, retention, params], ...]} (oldest in the
                              eviction order first; engine: [block_size, block_hashes, parent_block_hash,
                              token_ids] or null; retention: the class, 0 low, 1 normal, 2 high; params: how its
                              namespace's clients make keys, [chunk_tokens, key_scheme, hash_seed], or null)

Keys: each chunk's key and parent as its client sent them, beside its namespace; the daemon keeps them bound to
the namespace (``kvstore/binding.py``) and binds them again as it reads them.

Every chunk listed was committed and carries the checksum its bytes had at commit: nothing listed is served
before its bytes are hashed again and match (``adoption.py``). Versions: a reader refuses a version it does not
know in one line, and the arena is then freed, never guessed at. Version 2 added each chunk's retention class (a
pin is recorded as ``high``: its TTL does not survive the restart); version 3 each chunk's key parameters (what
``server/requests/compat.py`` checks at hello, so that a client that cuts chunks otherwise is refused after a restart as
before it). This daemon reads versions 1 (every chunk ``normal``), 2 and 3 (a chunk without parameters leaves its
namespace's unknown), and writes 3.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

from ...binding import rebind
from ...protocol.engine_blocks import EngineBlocks
from ...protocol.key_params import KeyParams, params_from_record
from ...protocol.retention import Retention

MAGIC = b"KVSKEPT\0"
FORMAT_VERSION = 3                 # what is written
READ_VERSIONS = (1, 2, 3)          # what is read (version 1 records have no retention class: normal; versions
                                   # before 3 no key parameters)
KEPT_CLASSES = (Retention.LOW, Retention.NORMAL, Retention.HIGH)   # a pin is kept as high
_HEADER = struct.Struct("<8sIIQQ")
SUFFIX = ".kept"


class DescriptionError(Exception):
    """The record beside a kept arena cannot be used (its message says why, in one line)."""


@dataclass(frozen=True, slots=True)
class KeptChunk:
    """One chunk in a kept arena: where it is, what it is, and the checksum it must still have."""

    key: bytes
    offset: int
    size: int
    namespace: str
    parent: bytes | None
    checksum: int
    leased: bool = False               # a reader held it at the stop (kept from reuse for a lease's TTL)
    engine: EngineBlocks | None = None
    retention: Retention = Retention.NORMAL   # its class (low, normal or high: a pin comes back as high)
    params: KeyParams | None = None    # how its namespace's clients make keys (None: not known)


@dataclass(frozen=True)
class ArenaDescription:
    socket: str
    uid: int
    arena_size: int
    chunks: list[KeptChunk]
    written: float = 0.0               # time.time() of the stop that wrote it


def description_path_for(arena_path: str) -> str:
    return arena_path + SUFFIX


def write_description(path: str, desc: ArenaDescription) -> None:
    """Write ``desc`` whole or not at all (a temporary file renamed over ``path``), owner-only."""
    payload = msgpack.packb({
        "socket": desc.socket, "uid": desc.uid, "arena_size": desc.arena_size, "written": time.time(),
        "chunks": [pack_chunk(c) for c in desc.chunks]}, use_bin_type=True)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(payload), xxhash.xxh3_64_intdigest(payload))
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def read_description(path: str) -> ArenaDescription | None:
    """The description at ``path`` (None: there is none). Raises DescriptionError naming what is wrong."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DescriptionError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) < _HEADER.size:
        raise DescriptionError(f"{path} is {len(data)} bytes, shorter than its header")
    magic, version, _, length, payload_sum = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise DescriptionError(f"{path} is not a kept-arena description (magic {magic!r})")
    if version not in READ_VERSIONS:
        raise DescriptionError(f"{path} is format version {version}; this kvstore reads versions "
                               f"{' and '.join(map(str, READ_VERSIONS))}")
    payload = data[_HEADER.size:]
    if len(payload) != length or xxhash.xxh3_64_intdigest(payload) != payload_sum:
        raise DescriptionError(f"{path} is damaged (its checksum does not match)")
    try:
        return _unpack(msgpack.unpackb(payload, raw=False))
    except (ValueError, TypeError, KeyError, IndexError, msgpack.UnpackException) as exc:
        raise DescriptionError(f"{path} does not decode: {exc}") from None


def remove_description(path: str) -> None:
    _unlink(path)


def pack_chunk(c: KeptChunk) -> list[Any]:
    """``c`` as the list a description (and the journal, ``journal.py``) stores: its key and parent as its client
    sent them (``binding.rebind``), beside its namespace."""
    engine = None if c.engine is None else [c.engine.block_size, list(c.engine.hashes), c.engine.parent,
                                            list(c.engine.token_ids)]
    parent = None if c.parent is None else rebind(c.namespace, c.parent)
    return [rebind(c.namespace, c.key), c.offset, c.size, c.namespace, parent, c.checksum, c.leased, engine,
            int(c.retention), None if c.params is None else c.params.record()]


def unpack_chunk(item: Any) -> KeptChunk:
    """The chunk ``pack_chunk`` made ``item`` from (a version 1 record, without the class, is ``normal``). Raises
    ValueError (or TypeError) when it is malformed."""
    if len(item) == 8:
        item = [*item, int(Retention.NORMAL)]
    if len(item) == 9:
        item = [*item, None]
    key, offset, size, namespace, parent, checksum, leased, engine, retention, params = item
    if not (isinstance(key, bytes) and type(offset) is int and type(size) is int and size > 0 and offset >= 0
            and isinstance(namespace, str) and (parent is None or isinstance(parent, bytes))
            and type(checksum) is int and retention in KEPT_CLASSES):
        raise ValueError(f"chunk record {item!r:.80} is malformed")
    blocks = None if engine is None else EngineBlocks(int(engine[0]), tuple(engine[1]), engine[2],
                                                      tuple(engine[3]))
    if len(key) != 16 or (parent is not None and len(parent) != 16):
        raise ValueError(f"chunk record {item!r:.80} is malformed: keys are 16 bytes")
    bound_parent = None if parent is None else rebind(namespace, parent)
    return KeptChunk(rebind(namespace, key), offset, size, namespace, bound_parent, checksum, bool(leased), blocks,
                     Retention(retention), params_from_record(params))


def _unpack(body: dict[str, Any]) -> ArenaDescription:
    chunks = [unpack_chunk(item) for item in body["chunks"]]
    return ArenaDescription(str(body["socket"]), int(body["uid"]), int(body["arena_size"]), chunks,
                            float(body.get("written", 0.0)))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
