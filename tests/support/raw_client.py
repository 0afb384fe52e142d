"""A ZeroMQ peer that sends the daemon whatever frames a test wants, well formed or not."""

from __future__ import annotations

import msgpack
import zmq

from kvstore.protocol.wire import PROTOCOL_VERSION, Op


class RawClient:
    """A DEALER that sends whatever bytes a test wants."""

    def __init__(self, address: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def request(self, header: dict, *payload: bytes) -> dict:
        self.send(msgpack.packb(header, use_bin_type=True), *payload)
        return self.reply()

    def reply(self, timeout_ms: int = 5000) -> dict:
        assert self.sock.poll(timeout_ms), "daemon did not reply"
        return msgpack.unpackb(self.sock.recv_multipart()[0], raw=False)

    def hello(self, arena: bool = True) -> dict:
        return self.request({"op": Op.HELLO, "id": 1, "version": PROTOCOL_VERSION, "namespace": "t", "arena": arena})

    def close(self) -> None:
        self.sock.close(0)
