"""The local stream socket: the default path of local clients, its permissions, pins dropped when a stream
closes, hostile bytes, a daemon restart under a client, and the ZeroMQ fallback."""

from __future__ import annotations

import os
import socket
import stat
import struct

import msgpack

from conftest import wait_for

from kvstore.client.stream_transport import StreamTransport
from kvstore.client.transport import Transport
from kvstore.protocol.stream import SUFFIX, reply_frames
from kvstore.protocol.wire import PROTOCOL_VERSION, Op


def test_local_clients_use_the_owner_only_stream_socket(daemon):
    path = daemon.socket_path + SUFFIX
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0
    fast = daemon.client(namespace="st", chunk_tokens=4)
    slow = daemon.client(namespace="st", chunk_tokens=4, stream=False)
    try:
        assert isinstance(fast.transport, StreamTransport) and isinstance(slow.transport, Transport)
        keys = fast.chunk_keys(list(range(4 * 3)))
        assert fast.put(keys, [bytes([i]) * 8192 for i in range(3)]) == 3
        with slow.get(keys) as views:
            assert [bytes(v[:2]) for v in views] == [bytes([i]) * 2 for i in range(3)]
        assert slow.put(keys, [b"z" * 8192] * 3) == 0
        with fast.get(keys) as views:
            assert len(views) == 3 and bytes(views[2][:1]) == b"\x02"
    finally:
        fast.close()
        slow.close()


def test_a_closed_stream_drops_its_pins_at_once(daemon):
    holder = daemon.client(namespace="st", chunk_tokens=4)
    watcher = daemon.client(namespace="st", chunk_tokens=4)
    keys = holder.chunk_keys(list(range(4 * 2)))
    holder.put(keys, [b"p" * 4096] * 2)
    lease = holder.get(keys)
    assert len(lease) == 2 and watcher.stats()["leases"] == 1
    lease.views = []                # the process "dies" holding the lease: only its stream closes
    holder.transport.close()
    assert wait_for(lambda: watcher.stats()["leases"] == 0, timeout=2)
    holder.close()
    watcher.close()


def _raw_stream(daemon) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(daemon.socket_path + SUFFIX)
    return s


def _read_reply(s: socket.socket) -> dict | None:
    buf = bytearray()
    while True:
        parsed = reply_frames(buf)
        if parsed is not None:
            return msgpack.unpackb(parsed[0][0], raw=False)
        data = s.recv(65536)
        if not data:
            return None
        buf += data


def test_hostile_bytes_on_the_stream_get_error_replies_and_the_daemon_keeps_serving(daemon):
    s = _raw_stream(daemon)
    for header in (b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"op": Op.LOOKUP, "id": 3, "keys": [b"x"]}),
                   msgpack.packb({"op": 999, "id": 4})):
        s.sendall(struct.pack("<I", len(header)) + header)
        reply = _read_reply(s)
        assert reply is not None and reply["ok"] is False and reply["code"]
    hello = msgpack.packb({"op": Op.HELLO, "id": 5, "version": PROTOCOL_VERSION, "namespace": "raw", "arena": True})
    s.sendall(struct.pack("<I", len(hello)))          # a request in pieces
    s.sendall(hello[:3])
    s.sendall(hello[3:])
    assert _read_reply(s)["ok"]
    s.sendall(struct.pack("<I", 1 << 30))              # a length that cannot be skipped: refused, then closed
    reply = _read_reply(s)
    assert reply is not None and reply["error"] == "LimitError"
    assert _read_reply(s) is None
    s.close()
    c = daemon.client(namespace="st")
    c.ping()
    c.close()
    assert "internal_error" not in daemon.log()


def test_a_client_follows_its_daemon_across_a_restart(start_daemon):
    daemon = start_daemon("--disk-size", "0")   # DRAM only: the restarted daemon starts empty
    c = daemon.client(namespace="st", chunk_tokens=4)
    keys = c.chunk_keys(list(range(4 * 2)))
    c.put(keys, [b"r" * 4096] * 2)
    daemon.restart()
    assert c.put(keys, [b"s" * 4096] * 2) == 2        # the lost stream: hello again, then the put
    assert isinstance(c.transport, StreamTransport)
    with c.get(keys) as views:
        assert bytes(views[0][:1]) == b"s"
    c.close()


def test_without_a_stream_socket_local_clients_use_zeromq(daemon):
    os.unlink(daemon.socket_path + SUFFIX)            # as if the daemon could not bind it
    c = daemon.client(namespace="st", chunk_tokens=4)
    try:
        assert isinstance(c.transport, Transport)
        keys = c.chunk_keys(list(range(4)))
        assert c.put(keys, [b"q" * 4096]) == 1 and c.lookup(keys) == 1
    finally:
        c.close()


def test_a_client_without_the_arena_moves_its_bytes_on_the_stream(daemon):
    """use_arena=False (as another user's client is served): puts and gets carry the bytes in the messages, on
    the stream socket, and come back byte for byte."""
    with daemon.client(namespace="st", chunk_tokens=4, use_arena=False) as c:
        assert isinstance(c.transport, StreamTransport)
        assert c.server_info["arena"] is None and c.server_info["index"] is None
        keys = c.chunk_keys(list(range(4 * 3)))
        chunks = [os.urandom(8192 + i) for i in range(3)]
        assert c.put(keys, chunks) == 3
        with c.get(keys) as views:
            assert [bytes(v) for v in views] == chunks
        out = [bytearray(9000) for _ in range(3)]
        assert c.get_into(keys, out) == 3 and [bytes(o[:len(x)]) for o, x in zip(out, chunks)] == chunks
        many = [os.urandom(16) for _ in range(1500)]   # more payloads than one sendmsg takes (IOV_MAX)
        small = [os.urandom(64) for _ in many]
        assert c.put(many, small) == 1500
        with c.get(many) as views:
            assert [bytes(v) for v in views] == small
    with daemon.client(namespace="st", chunk_tokens=4) as mapped:   # the same chunks, through the arena
        with mapped.get(keys) as views:
            assert [bytes(v) for v in views] == chunks


def _framed(frames: list[bytes]) -> bytes:
    return struct.pack(f"<{len(frames) + 1}I", (1 << 31) | len(frames), *map(len, frames)) + b"".join(frames)


def test_framed_requests_that_are_too_long_are_read_past_or_refused(start_daemon):
    daemon = start_daemon("--disk-size", "0", "--max-chunk", "64KiB")
    s = _raw_stream(daemon)
    hello = msgpack.packb({"op": Op.HELLO, "id": 1, "version": PROTOCOL_VERSION, "namespace": "raw", "arena": False})
    s.sendall(struct.pack("<I", len(hello)) + hello)
    assert _read_reply(s)["ok"]
    put = msgpack.packb({"op": Op.PUT_INLINE, "id": 2, "keys": os.urandom(16)})
    s.sendall(_framed([put, b"x" * (128 << 10)]))      # a payload over the largest chunk: read past, answered
    reply = _read_reply(s)
    assert reply["error"] == "LimitError" and reply["id"] == 2 and "payload frame 0" in reply["msg"]
    put = msgpack.packb({"op": Op.PUT_INLINE, "id": 3, "keys": os.urandom(16)})
    s.sendall(_framed([put, b"y" * 4096]))            # the stream is still in step: the next one is stored
    reply = _read_reply(s)
    assert reply["ok"] and reply["id"] == 3 and reply["committed"] == 1
    s.sendall(struct.pack("<I", (1 << 31) | 1) + b"\0" * 8)   # a framed request of one frame: none is sent
    reply = _read_reply(s)
    assert reply is not None and reply["error"] == "LimitError" and "closing the stream" in reply["msg"]
    assert _read_reply(s) is None
    s.close()
