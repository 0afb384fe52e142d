"""On-disk chunk format: one file per chunk, a 4 KiB header block followed by the payload.

Layout (little-endian)::

    0   8  magic        b"KVSCHUNK"
    8   2  version      1, 2 when the header carries the engine's block names (bit 3), 3 when it carries key
                        parameters (bit 4)
    10  2  flags        bit 0: payload is lz4-compressed (block format, raw length known);
                        bit 1: payload_sum covers the raw chunk (after decompression), not the stored bytes;
                        bit 2: the 16-byte key of the chunk's parent follows the namespace
                        bit 3 (version 2): the engine's block names follow (``EngineBlocks``): block_size u32,
                        block count n u32, has_parent u8, 3 zero bytes, parent u64, n hashes u64, then
                        n × block_size token ids u32
                        bit 4 (version 3): the key parameters of the chunk's namespace follow (``KeyParams``, what
                        ``server/requests/compat.py`` checks at hello): chunk_tokens u32, hash_seed u64, scheme length
                        u16, the key scheme (UTF-8)
    12  2  ns_len       bytes of the UTF-8 namespace stored at offset 64
    14  2  retention    the chunk's retention class as it was written: 0 normal (and every file from before the
                        field, when it was a reserved 0), 1 low, 2 high (a pin is written as high)
    16 16  key          the chunk's 16-byte chained key as its client sent it (``ChunkHeader.key`` is the key the
                        daemon keeps, bound to the namespace: ``kvstore/binding.py``; the file is named by it)
    32  8  raw_len      length of the chunk as put
    40  8  stored_len   length of the payload on disk (== raw_len unless compressed)
    48  8  payload_sum  xxh3-64 of the chunk (of the stored payload in lz4 files without bit 1)
    56  8  header_sum   xxh3-64 of bytes 0..56 and of everything after byte 64 (namespace, parent, engine names)
    64  …  namespace, then the parent key (with flag bit 2; as sent, like the key), then the engine names (with flag
           bit 3), then the key parameters (with flag bit 4)
    4096   payload (stored_len bytes); the file is exactly HEADER_BYTES + stored_len long

The header fills one 4 KiB block so that the payload starts block-aligned: O_DIRECT reads and writes move the
payload straight between the device and a page-aligned slot of the host arena, with no staging copy. The header
carries its own checksum so that the index is rebuilt at start from headers alone (one 4 KiB read per file,
thousands of files a second) and still rejects a torn or foreign header; the payload checksum is checked on
every read, where a failure is a miss, never data. xxh3-64 runs at memory bandwidth, far above any NVMe.

The payload sum is the chunk's own checksum, the one it carries in DRAM from commit on (``store/integrity.py``):
a write checks the slot against it and stores it, a read returns it, so the sum is computed once per chunk and
never again for the disk. For an uncompressed payload it is the sum of the stored bytes as well; lz4 files
written before the flag existed sum their compressed bytes, and are read as before.

Retention. The class lives in what was a reserved field that readers never checked, so the versions did not
change: a file from before it reads as ``normal``, and an older daemon reads a file that carries a class (it
ignores the field). It is the class the chunk had when the file was written; a class raised later is the disk
queue's and DRAM's until the next restart, not the file's.

Versions: a file is written as version 1 unless it carries engine names (they must survive a restart so the
chunk's KV cache events keep naming the engine's blocks); those that do not fit the header block are left out,
and the file is version 1. Since version 3 a file carries its namespace's key parameters whenever the daemon knows
them (so that a client cutting chunks otherwise is refused after a cold restart as before it), and is written as
version 3. This daemon reads all three (a file without parameters leaves its namespace's unknown); a daemon that
reads older versions only quarantines a newer file (moved aside, never removed), so a downgrade loses those
chunks' cache hits, not data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from ...binding import rebind
from ...errors import BadRequestError, FormatError, LimitError
from ...protocol.engine_blocks import EngineBlocks, read_engine_chunk
from ...protocol.key_params import KeyParams, params_from_packed
from ...protocol.retention import Retention

MAGIC = b"KVSCHUNK"
FORMAT_VERSION = 1          # what a file without engine names is written as
ENGINE_FORMAT_VERSION = 2   # ... and one with them
PARAMS_FORMAT_VERSION = 3   # ... and one with its namespace's key parameters (every file, when they are known)
READ_VERSIONS = (FORMAT_VERSION, ENGINE_FORMAT_VERSION, PARAMS_FORMAT_VERSION)
HEADER_BYTES = 4096
FLAG_LZ4 = 1
FLAG_RAW_SUM = 2
FLAG_PARENT = 4
FLAG_ENGINE = 8
FLAG_PARAMS = 16
KEY_BYTES = 16
MAX_NAMESPACE_BYTES = HEADER_BYTES - 64 - KEY_BYTES

_FIXED = struct.Struct("<8sHHHH16sQQQ")
_SUM = struct.Struct("<Q")
_ENGINE_HEAD = struct.Struct("<IIB3xQ")
assert _FIXED.size == 56
# the retention field: 0 is normal, so that every file written before the field reads as normal
_CLASS_CODE = {Retention.NORMAL: 0, Retention.LOW: 1, Retention.HIGH: 2, Retention.PIN: 2}
_CODE_CLASS = {0: Retention.NORMAL, 1: Retention.LOW, 2: Retention.HIGH}


@dataclass(frozen=True)
class ChunkHeader:
    key: bytes
    namespace: str
    raw_len: int
    stored_len: int
    payload_sum: int
    flags: int = 0
    parent: bytes | None = None   # the previous chunk of its chain: continuations are found again after a restart
    engine: EngineBlocks | None = None   # the engine's names of its blocks (for the KV cache events)
    retention: Retention = Retention.NORMAL   # its class when written (a pin is written as high)
    params: KeyParams | None = None   # how its namespace's clients make keys (server/requests/compat.py), when known

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_LZ4)

    @property
    def raw_sum(self) -> bool:
        """Whether ``payload_sum`` is the chunk's own checksum (always so for uncompressed payloads)."""
        return bool(self.flags & FLAG_RAW_SUM) or not self.compressed

    @property
    def file_len(self) -> int:
        return HEADER_BYTES + self.stored_len


def checksum(data: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def pack_header(header: ChunkHeader, into: memoryview | bytearray | None = None) -> bytes | bytearray | memoryview:
    """The 4 KiB header block; written into ``into`` (an aligned buffer) when given."""
    ns = header.namespace.encode()
    if len(ns) > MAX_NAMESPACE_BYTES:
        raise ValueError(f"namespace of {len(ns)} bytes does not fit the header ({MAX_NAMESPACE_BYTES} max)")
    flags = header.flags | (FLAG_PARENT if header.parent is not None else 0)
    tail = ns + (rebind(header.namespace, header.parent) if header.parent is not None else b"")
    names = _pack_engine(header.engine) if header.engine is not None else b""
    if names and 64 + len(tail) + len(names) <= HEADER_BYTES:
        flags |= FLAG_ENGINE
        tail += names
    params = header.params.packed() if header.params is not None else b""
    if params and 64 + len(tail) + len(params) <= HEADER_BYTES:
        flags |= FLAG_PARAMS
        tail += params
    version = (PARAMS_FORMAT_VERSION if flags & FLAG_PARAMS else
               ENGINE_FORMAT_VERSION if flags & FLAG_ENGINE else FORMAT_VERSION)
    fixed = _FIXED.pack(MAGIC, version, flags, len(ns), _CLASS_CODE[header.retention],
                        rebind(header.namespace, header.key), header.raw_len, header.stored_len, header.payload_sum)
    block = into if into is not None else bytearray(HEADER_BYTES)
    block[:HEADER_BYTES] = bytes(HEADER_BYTES)
    block[0:56] = fixed
    block[56:64] = _SUM.pack(checksum(fixed + tail))
    block[64:64 + len(tail)] = tail
    return block if into is not None else bytes(block)


def unpack_header(block: bytes | memoryview, file_len: int | None = None) -> ChunkHeader:
    """Parse and check a header block; ``file_len`` (when known) must match. Raises FormatError."""
    if len(block) < 64:
        raise FormatError(f"header is {len(block)} bytes, shorter than the fixed part")
    fixed = bytes(block[0:56])
    magic, version, flags, ns_len, code, key, raw_len, stored_len, payload_sum = _FIXED.unpack(fixed)
    if magic != MAGIC:
        raise FormatError("bad magic: not a kvstore chunk file")
    if version not in READ_VERSIONS:
        raise FormatError(f"format version {version}, this daemon reads {' and '.join(map(str, READ_VERSIONS))}")
    if flags & FLAG_ENGINE and version < ENGINE_FORMAT_VERSION:
        raise FormatError(f"engine names (flag {FLAG_ENGINE}) in a version {version} header")
    if flags & FLAG_PARAMS and version < PARAMS_FORMAT_VERSION:
        raise FormatError(f"key parameters (flag {FLAG_PARAMS}) in a version {version} header")
    if ns_len > MAX_NAMESPACE_BYTES or 64 + ns_len > len(block):
        raise FormatError(f"namespace length {ns_len} out of range")
    ns = bytes(block[64:64 + ns_len])
    parent = bytes(block[64 + ns_len:64 + ns_len + KEY_BYTES]) if flags & FLAG_PARENT else None
    at = 64 + ns_len + (KEY_BYTES if parent is not None else 0)
    engine, names = _unpack_engine(block, at) if flags & FLAG_ENGINE else (None, b"")
    params, params_bytes = _unpack_params(block, at + len(names)) if flags & FLAG_PARAMS else (None, b"")
    (header_sum,) = _SUM.unpack(bytes(block[56:64]))
    if checksum(fixed + ns + (parent or b"") + names + params_bytes) != header_sum:
        raise FormatError("header checksum mismatch")
    if flags & ~(FLAG_LZ4 | FLAG_RAW_SUM | FLAG_PARENT | FLAG_ENGINE | FLAG_PARAMS):
        raise FormatError(f"unknown flags {flags:#x}")
    if code not in _CODE_CLASS:
        raise FormatError(f"unknown retention class {code} (0 normal, 1 low, 2 high)")
    if stored_len == 0 or raw_len == 0 or (not flags & FLAG_LZ4 and stored_len != raw_len):
        raise FormatError(f"inconsistent lengths raw={raw_len} stored={stored_len}")
    namespace = ns.decode(errors="replace")
    header = ChunkHeader(rebind(namespace, key), namespace, raw_len, stored_len, payload_sum,
                         flags & ~(FLAG_PARENT | FLAG_ENGINE | FLAG_PARAMS),
                         None if parent is None else rebind(namespace, parent), engine, _CODE_CLASS[code], params)
    if file_len is not None and file_len != header.file_len:
        raise FormatError(f"file is {file_len} bytes, header says {header.file_len}")
    return header


def _unpack_params(block: bytes | memoryview, at: int) -> tuple[KeyParams, bytes]:
    """The key parameters at ``at`` and their bytes (for the header sum). Raises FormatError."""
    data = bytes(block[:HEADER_BYTES])
    found = params_from_packed(data, at)
    if found is None:
        raise FormatError("key parameters run past the header block or do not decode")
    params, end = found
    return params, data[at:end]


def _pack_engine(engine: EngineBlocks) -> bytes:
    n = len(engine.hashes)
    head = _ENGINE_HEAD.pack(engine.block_size, n, engine.parent is not None, engine.parent or 0)
    return head + struct.pack(f"<{n}Q", *engine.hashes) + struct.pack(f"<{len(engine.token_ids)}I", *engine.token_ids)


def _unpack_engine(block: bytes | memoryview, at: int) -> tuple[EngineBlocks, bytes]:
    """The engine names at ``at`` and their bytes (for the header sum). Raises FormatError."""
    if at + _ENGINE_HEAD.size > min(len(block), HEADER_BYTES):
        raise FormatError("engine names run past the header block")
    size, n, has_parent, parent = _ENGINE_HEAD.unpack(bytes(block[at:at + _ENGINE_HEAD.size]))
    end = at + _ENGINE_HEAD.size + 8 * n + 4 * n * size
    if n == 0 or size == 0 or end > min(len(block), HEADER_BYTES):
        raise FormatError(f"engine names of {n} blocks of {size} tokens do not fit the header block")
    names = bytes(block[at:end])
    hashes = struct.unpack_from(f"<{n}Q", names, _ENGINE_HEAD.size)
    tokens = struct.unpack_from(f"<{n * size}I", names, _ENGINE_HEAD.size + 8 * n)
    try:   # the same checks as on the wire
        engine = read_engine_chunk([list(hashes), parent if has_parent else None, list(tokens)], size, "disk")
    except (BadRequestError, LimitError) as exc:
        raise FormatError(f"bad engine names: {exc}") from None
    assert engine is not None
    return engine, names
