"""The KV cache event publisher: a ZeroMQ PUB socket written on the event loop, and a ROUTER for replay served
by a thread of its own.

Publishing never waits. The Store's changes within one turn of the event loop are gathered (``submit``) and sent
as one batch at the end of that turn (``flush``, scheduled with ``call_soon``; before the loop runs, at start-up,
at once): one msgpack pack and one non-blocking send. The PUB socket never blocks a send: a subscriber more than
``--events-hwm`` batches behind loses the batches past that in ZeroMQ, and sees the gap in ``seq`` (it can ask
the replay socket for them). A send the socket refuses outright is counted as dropped
(``kvstore_events_dropped_total``) and leaves its sequence number unused on the wire, a gap too. Sending on the
loop thread rather than a sender thread keeps the loop from ever waiting for another thread to hand back the
interpreter lock, which on a loaded machine costs far more than the pack and send themselves.

The last ``--events-buffer`` batches are kept for replay; the replay thread answers requests from a copy of that
buffer taken under a lock (``protocol/kv_events.py`` has the protocol and the formats).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import msgpack
import zmq

from .. import logs
from ..defaults import EVENTS_BUFFER, EVENTS_FORMAT, EVENTS_HWM
from ..errors import ConfigError
from ..protocol.kv_events import END_SEQ, SNAPSHOT_REQUEST, Event, batch_body, seq_bytes
from ..store.events import Holding, snapshot_events

REPLAY_POLL_MS = 200     # how long the replay thread waits for a request before it looks for the stop flag
SNAPSHOT_WAIT_S = 5.0    # how long a snapshot request waits for the event loop to copy the holdings
MAX_BATCH_EVENTS = 4096  # events packed into one batch at most
_MORE = zmq.SNDMORE | zmq.NOBLOCK


@dataclass(frozen=True)
class EventSettings:
    endpoint: str
    replay_endpoint: str = ""
    buffer: int = EVENTS_BUFFER   # batches kept for replay
    hwm: int = EVENTS_HWM         # batches ZeroMQ queues per subscriber before it drops for that one
    fmt: str = EVENTS_FORMAT
    topic: str = ""


@dataclass
class EventCounters:
    events: int = 0      # events sent
    batches: int = 0     # batches sent
    dropped: int = 0     # events in batches the socket refused
    replays: int = 0     # replay requests answered
    snapshots: int = 0   # snapshot requests answered


class EventPublisher:
    """Owns the PUB and ROUTER sockets, their context, the replay buffer and the replay thread."""

    def __init__(self, settings: EventSettings) -> None:
        self.settings = settings
        self.incarnation = os.urandom(8).hex()
        self.counters = EventCounters()
        self._pending: list[Event] = []
        self._scheduled = False
        self._packer = msgpack.Packer()   # used on the event loop only
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=settings.buffer)
        self._buffer_lock = threading.Lock()   # the loop appends, the replay thread copies
        self._topic = settings.topic.encode()
        self._next_seq = 0
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.holdings: Callable[[], list[tuple[bytes, Holding]]] | None = None   # the Store's event log's
        self._thread: threading.Thread | None = None
        self._ctx = zmq.Context()
        self._pub: zmq.Socket | None = None
        self._replay: zmq.Socket | None = None
        self._pub = self._bind(zmq.PUB, settings.endpoint, "--events-endpoint", settings.hwm)
        if settings.replay_endpoint:
            self._replay = self._bind(zmq.ROUTER, settings.replay_endpoint, "--events-replay-endpoint",
                                      2 * (settings.buffer + 1))   # a whole replay and its end marker fit
            self._thread = threading.Thread(target=self._serve_replays, name="kv-events-replay", daemon=True)
            self._thread.start()

    def _bind(self, kind: int, endpoint: str, flag: str, hwm: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, hwm)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            self.close()
            raise ConfigError(f"{flag}: cannot listen on {endpoint}: {exc}") from None
        return sock

    # -- the event loop's side -------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop serves: snapshots are taken on it from now on."""
        self._loop = loop

    def submit(self, events: list[Event]) -> None:
        """Add ``events`` to the batch this turn of the event loop sends (at once when no loop runs)."""
        self._pending.extend(events)
        if len(self._pending) >= MAX_BATCH_EVENTS:
            self.flush()
            return
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()   # start-up: the adopted chunks are announced as they are found
            return
        self._scheduled = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send what was gathered as one batch, numbered, and keep it for replay. Never blocks."""
        self._scheduled = False
        events, self._pending = self._pending, []
        if not events or self._pub is None:
            return
        seq = self._next_seq
        self._next_seq += 1
        s = self.settings
        payload = self._packer.pack(batch_body(time.time(), events, s.fmt, self.incarnation))
        pub = self._pub
        try:   # three plain sends: send_multipart's per-frame checks cost more than the sends here
            pub.send(self._topic, _MORE)
            pub.send(seq_bytes(seq), _MORE)
            pub.send(payload, zmq.NOBLOCK)
            self.counters.batches += 1
            self.counters.events += len(events)
        except zmq.ZMQError:   # refused (closing, or no room): a gap on the wire, still in the replay buffer
            self.counters.dropped += len(events)
        with self._buffer_lock:
            self._buffer.append((seq, payload))

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {"events": c.events, "batches": c.batches, "dropped": c.dropped, "replays": c.replays,
                "snapshots": c.snapshots,
                "pending": len(self._pending), "buffered": len(self._buffer), "next_seq": self._next_seq,
                "incarnation": self.incarnation}

    def close(self) -> None:
        """Send what is gathered, stop the replay thread, close the sockets."""
        if self._pub is not None and self._pending:
            self.flush()
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(2 * REPLAY_POLL_MS / 1000)
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
        self._ctx.term()

    def _copy_holdings(self, done: concurrent.futures.Future) -> None:
        """On the loop: send what is gathered, then copy what is held (consistent with the last seq sent)."""
        try:
            self.flush()
            rows = self.holdings() if self.holdings is not None else []
            done.set_result((self._next_seq - 1, rows))
        except BaseException as exc:   # noqa: BLE001 - handed to the waiting thread
            done.set_exception(exc)

    # -- the replay thread -----------------------------------------------------------------------------------
    def _serve_replays(self) -> None:
        replay = self._replay
        assert replay is not None
        packer = msgpack.Packer()   # this thread's own
        while not self._stopping.is_set():
            if not replay.poll(REPLAY_POLL_MS):
                continue
            frames = replay.recv_multipart()
            if len(frames) == 3 and frames[2] == SNAPSHOT_REQUEST:
                self._answer_snapshot(replay, frames[0], packer)
                continue
            if len(frames) != 3 or len(frames[2]) != 8:
                logs.warning("kv_events_bad_replay_request", frames=len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            with self._buffer_lock:
                batches = [(seq, payload) for seq, payload in self._buffer if seq >= first]
            for seq, payload in batches:
                replay.send_multipart((client, b"", self._topic, seq_bytes(seq), payload))
            replay.send_multipart((client, b"", b"", END_SEQ, b""))
            self.counters.replays += 1

    def _answer_snapshot(self, replay: zmq.Socket, client: bytes, packer: msgpack.Packer) -> None:
        """One batch of everything held now (built and packed here, off the loop), then the end marker; only
        the end marker when the loop does not answer (not serving yet, or stopping)."""
        loop = self._loop
        done: concurrent.futures.Future[tuple[int, list[tuple[bytes, Holding]]]] = concurrent.futures.Future()
        try:
            if loop is None:
                raise RuntimeError("not serving yet")
            loop.call_soon_threadsafe(self._copy_holdings, done)
            seq, rows = done.result(SNAPSHOT_WAIT_S)
        except (RuntimeError, concurrent.futures.TimeoutError) as exc:
            logs.warning("kv_events_snapshot_failed", error=str(exc) or "timed out")
        else:
            s = self.settings
            payload = packer.pack(batch_body(time.time(), snapshot_events(rows), s.fmt, self.incarnation))
            replay.send_multipart((client, b"", self._topic, seq_bytes(seq), payload))
            self.counters.snapshots += 1
        replay.send_multipart((client, b"", b"", END_SEQ, b""))
