"""Remote value format: a fixed 64-byte header followed by the chunk payload.

A value in a remote store is trusted no more than a file on disk: another
writer, a server bug, a truncated transfer or an operator's ``SET`` can leave
anything under a key. Every value therefore carries the same facts as a disk
file, and a reader serves the payload only if all of them hold:

    offset size field
    0      4    magic            b"KVRC"
    4      2    format version   1
    6      2    key length       0..32
    8      8    payload length   bytes that follow the header
    16     8    payload checksum xxh3-64 of the payload
    24     8    namespace tag    xxh3-64 of the namespace
    32     32   key              chunk key, zero padded
    64     ...  payload

The header has a fixed size so that a zero-copy reader can scatter it into a
small buffer and the payload straight into its destination slot. Anything that
fails (short value, wrong magic or version, other key or namespace, length or
checksum mismatch) is ``None`` for the caller: a miss, never wrong KV bytes.
Cost: one xxh3 pass over the payload on read (xxh3 runs at memory bandwidth, far
above a network link's), and on write unless the writer gives the chunk's checksum
(the daemon does: the sum it took at commit).
"""

from __future__ import annotations

import struct

import xxhash

from ...errors import RecordError

__all__ = [
    "HEADER_SIZE",
    "MAX_KEY_SIZE",
    "RecordError",
    "check_header",
    "check_payload",
    "decode",
    "encode",
    "encode_header",
    "namespace_tag",
    "object_name",
]

MAGIC = b"KVRC"
VERSION = 1
MAX_KEY_SIZE = 32
_HEADER = struct.Struct("<4sHHQQQ32s")
HEADER_SIZE = _HEADER.size
assert HEADER_SIZE == 64


def namespace_tag(namespace: str | bytes) -> int:
    if isinstance(namespace, str):
        namespace = namespace.encode()
    return xxhash.xxh3_64_intdigest(namespace)


def object_name(namespace: str | bytes, key: bytes, prefix: str = "kvs") -> str:
    """Name of the remote object for chunk ``key``: ``kvs:<ns tag>:<key hex>``.

    The namespace tag keeps deployments that share one store apart and lets an
    operator find (``SCAN kvs:<tag>:*``) or drop one namespace's objects.
    """
    return f"{prefix}:{namespace_tag(namespace):016x}:{bytes(key).hex()}"


def encode_header(namespace: str | bytes, key: bytes, payload, checksum: int | None = None) -> bytes:
    """The header of ``payload``; ``checksum`` is the chunk's own sum when the caller carries one (a daemon's
    chunk keeps the sum it got at commit, so bytes damaged since then fail on read instead of being vouched
    for), else it is computed here."""
    key = bytes(key)
    if len(key) > MAX_KEY_SIZE:
        raise ValueError(f"chunk key longer than {MAX_KEY_SIZE} bytes")
    view = memoryview(payload).cast("B")
    if checksum is None:
        checksum = xxhash.xxh3_64_intdigest(view)
    return _HEADER.pack(MAGIC, VERSION, len(key), view.nbytes, checksum, namespace_tag(namespace), key)


def encode(namespace: str | bytes, key: bytes, payload) -> bytes:
    """Header and payload as one bytes object (for stores that take one value)."""
    return encode_header(namespace, key, payload) + bytes(payload)


def check_header(header, namespace: str | bytes, key: bytes) -> tuple[int, int]:
    """Validate a header for ``key``; return ``(payload length, checksum)``."""
    if len(header) < HEADER_SIZE:
        raise RecordError("value shorter than its header")
    magic, version, key_len, length, checksum, ns_tag, stored_key = _HEADER.unpack_from(header)
    if magic != MAGIC:
        raise RecordError("bad magic")
    if version != VERSION:
        raise RecordError(f"unknown format version {version}")
    if key_len > MAX_KEY_SIZE or stored_key[:key_len] != bytes(key) or ns_tag != namespace_tag(namespace):
        raise RecordError("value belongs to another key or namespace")
    return length, checksum


def check_payload(payload, length: int, checksum: int) -> None:
    view = memoryview(payload).cast("B")
    if view.nbytes != length:
        raise RecordError(f"payload is {view.nbytes} bytes, header says {length}")
    if xxhash.xxh3_64_intdigest(view) != checksum:
        raise RecordError("payload checksum mismatch")


def decode(value, namespace: str | bytes, key: bytes) -> memoryview:
    """The payload of a whole stored value, as a view into ``value``."""
    view = memoryview(value).cast("B")
    length, checksum = check_header(view[:HEADER_SIZE], namespace, key)
    payload = view[HEADER_SIZE:]
    check_payload(payload, length, checksum)
    return payload
