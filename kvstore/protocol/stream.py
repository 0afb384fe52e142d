"""Framing of the local stream socket: the same msgpack messages as on ZeroMQ, length-prefixed on a Unix stream.

A round trip through ZeroMQ passes four threads (each side's application thread and I/O thread); on a Unix
stream socket it passes two, the client's and the daemon's event loop, so each request pays two thread wake-ups
fewer, which is most of a small request's cost on a loaded host, in the median and more so in the tail
(``bench/client_throughput.py`` measures both paths). So local clients (``ipc://``) say hello on ZeroMQ, learn
the stream socket's path from the reply, and send every further request on it; the ZeroMQ socket stays as the
fallback and for ``tcp://``.

Request: ``u32 length`` + one msgpack header (``wire.py``); requests carry no payload frames (clients of this
socket map the arena; PUT_INLINE goes over ZeroMQ). A request longer than ``MAX_HEADER_BYTES`` is read past, not
kept (its length says where the next one starts), and answered with a LimitError; the connection stays open.

Reply: ``u32 frames`` + ``u32 length`` per frame + the frames (the header first, then any payloads).
"""

from __future__ import annotations

import struct
from typing import Sequence

from .wire import MAX_FRAMES, MAX_HEADER_BYTES

SUFFIX = ".stream"   # the stream socket is the ZeroMQ ipc:// socket's path plus this
LENGTH = struct.Struct("<I")
REQUEST_PREFIX = LENGTH.size


def request_bytes(header: bytes) -> bytes:
    return LENGTH.pack(len(header)) + header


def reply_bytes(frames: Sequence[bytes | memoryview]) -> bytes:
    """The reply as one buffer: written with one system call, it wakes the reader once, with all of it."""
    lengths = struct.pack(f"<{len(frames) + 1}I", len(frames), *(len(f) for f in frames))
    return b"".join([lengths, *frames])


def reply_frames(buf: bytearray | memoryview) -> tuple[list[bytes], int] | None:
    """Split one complete reply off the front of ``buf``: (frames, bytes used), or None if it is not all there."""
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
    if len(buf) < end:
        return None
    frames, pos = [], start
    for n in lengths:
        frames.append(bytes(buf[pos:pos + n]))
        pos += n
    return frames, end


def request_too_long(length: int) -> bool:
    return length > MAX_HEADER_BYTES
