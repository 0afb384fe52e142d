"""Framing of the local stream socket: the same msgpack messages as on ZeroMQ, length-prefixed on a Unix stream.

A round trip through ZeroMQ passes four threads (each side's application thread and I/O thread); on a Unix
stream socket it passes two, the client's and the daemon's event loop, so each request pays two thread wake-ups
fewer, which is most of a small request's cost on a loaded host, in the median and more so in the tail
(``bench/client_throughput.py`` measures both paths). So local clients (``ipc://``) say hello on ZeroMQ, learn
the stream socket's path from the reply, and send every further request on it; the ZeroMQ socket stays as the
fallback and for ``tcp://``.

Request: ``u32 length`` + one msgpack header (``wire.py``). A request with payload frames (a PUT_INLINE of a
client that does not map the arena: another local user's, ``docs/operations/tenants.md``) is laid out as a reply
is, its count marked by the top bit: ``u32 (FRAMED | frames)`` + ``u32 length`` per frame + the frames (the header
first). A request whose header is longer than ``MAX_HEADER_BYTES``, or whose payload frame is longer than the
daemon's largest chunk, is read past, not kept (its lengths say where the next one starts), and answered with a
LimitError; the connection stays open.

Reply: ``u32 frames`` + ``u32 length`` per frame + the frames (the header first, then any payloads).
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

from .wire import MAX_FRAMES, MAX_HEADER_BYTES

SUFFIX = ".stream"   # the stream socket is the ZeroMQ ipc:// socket's path plus this
LENGTH = struct.Struct("<I")
REQUEST_PREFIX = LENGTH.size
FRAMED = 1 << 31     # the top bit of a request's first word: a count of frames follows, not a header's length


def request_bytes(header: bytes, payloads: Sequence[Any] = ()) -> bytes:
    """One request as one buffer: its header alone (``u32 length`` + header), or with payload frames, framed as a
    reply is."""
    return b"".join(request_parts(header, payloads))


def request_parts(header: bytes, payloads: Sequence[Any] = ()) -> list[Any]:
    """One request as buffers to write one after the other (``sendmsg``), so that payloads are never copied to
    be sent: the lengths and the header in one, then each payload frame as it is (bytes-like)."""
    if not payloads:
        return [LENGTH.pack(len(header)) + header]
    lengths = struct.pack(f"<{len(payloads) + 2}I", FRAMED | (len(payloads) + 1), len(header),
                          *(memoryview(f).nbytes for f in payloads))
    return [lengths + header, *payloads]


def framed_lengths(buf: bytearray | memoryview) -> tuple[int, ...] | None:
    """The frame lengths of the framed request at the front of ``buf`` (its first word has ``FRAMED``), or None
    if they are not all there yet. Raises ValueError for a count no request has (under 2, over ``MAX_FRAMES``)."""
    count = LENGTH.unpack_from(buf, 0)[0] & ~FRAMED
    if not 2 <= count <= MAX_FRAMES:
        raise ValueError(f"request claims {count} frames; a framed request has 2 to {MAX_FRAMES}")
    if len(buf) < 4 + 4 * count:
        return None
    return struct.unpack_from(f"<{count}I", buf, 4)


def reply_bytes(frames: Sequence[bytes | memoryview]) -> bytes:
    """The reply as one buffer: written with one system call, it wakes the reader once, with all of it."""
    return b"".join([reply_lengths(frames), *frames])


def reply_lengths(frames: Sequence[bytes | memoryview]) -> bytes:
    """What precedes a reply's frames: their count and lengths."""
    return struct.pack(f"<{len(frames) + 1}I", len(frames), *(len(f) for f in frames))


def reply_layout(buf: bytearray | memoryview) -> tuple[tuple[int, ...], int, int] | None:
    """The frame lengths of the reply at the front of ``buf``, where its frames start and where it ends, or None if
    it is not all there. Raises ValueError for a count no reply has."""
    if len(buf) < 4:
        return None
    (count,) = LENGTH.unpack_from(buf, 0)
    if not 1 <= count <= MAX_FRAMES:
        raise ValueError(f"reply claims {count} frames")
    start = 4 + 4 * count
    if len(buf) < start:
        return None
    lengths = struct.unpack_from(f"<{count}I", buf, 4)
    end = start + sum(lengths)
    return (lengths, start, end) if len(buf) >= end else None


def split_frames(whole: memoryview, lengths: Sequence[int], start: int) -> list[memoryview]:
    """Views of the frames laid end to end in ``whole`` from ``start``."""
    frames, pos = [], start
    for n in lengths:
        frames.append(whole[pos:pos + n])
        pos += n
    return frames


def reply_frames(buf: bytearray | memoryview) -> tuple[list[bytes], int] | None:
    """Split one complete reply off the front of ``buf``: (frames, bytes used), or None if it is not all there."""
    layout = reply_layout(buf)
    if layout is None:
        return None
    lengths, start, end = layout
    with memoryview(buf) as view:
        return [bytes(f) for f in split_frames(view, lengths, start)], end


def request_too_long(length: int) -> bool:
    return length > MAX_HEADER_BYTES
