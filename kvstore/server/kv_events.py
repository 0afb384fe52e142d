"""The KV cache event publisher: a ZeroMQ PUB socket (and a ROUTER for replay) served by a thread of its own.

The event loop only ever hands a list of events to ``submit``: a length check and a put on a lock-free queue,
never a wait. The queue is bounded (``--events-queue`` hand-offs); past the bound the events are dropped and
counted (``kvstore_events_dropped_total``), and the next batch sent skips one sequence number, so a consumer sees
the gap and knows it missed something rather than silently drifting.

The thread takes whatever has been handed off, packs it into one batch (msgpack, outside the event loop),
numbers it, sends it without blocking (a subscriber past the socket's high-water mark loses it in ZeroMQ, and
sees the gap) and keeps the last ``--events-buffer`` batches for replay. Between batches it answers replay
requests on the ROUTER (``protocol/kv_events.py`` has the protocol). Formats and fields: ``protocol/kv_events.py``.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from .. import logs
from ..errors import ConfigError
from ..protocol.kv_events import END_SEQ, Event, batch_body, seq_bytes

IDLE_WAIT_S = 0.02       # how long the thread waits for events before it looks at the replay socket again
MAX_BATCH_EVENTS = 4096  # events packed into one batch at most
PUB_HWM = 100_000        # batches ZeroMQ queues per subscriber before it drops for that subscriber


@dataclass(frozen=True)
class EventSettings:
    endpoint: str
    replay_endpoint: str = ""
    buffer: int = 10_000         # batches kept for replay
    queue: int = 100_000         # hand-offs from the event loop waiting for the thread
    fmt: str = "map"
    topic: str = ""


@dataclass
class EventCounters:
    events: int = 0      # events sent
    batches: int = 0     # batches sent
    dropped: int = 0     # events dropped because the hand-off queue was full
    replays: int = 0     # replay requests answered


class EventPublisher:
    """Owns the PUB and ROUTER sockets, their context and the thread that serves both."""

    def __init__(self, settings: EventSettings) -> None:
        self.settings = settings
        self.incarnation = os.urandom(8).hex()
        self.counters = EventCounters()
        self._queue: queue.SimpleQueue[list[Event] | None] = queue.SimpleQueue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=settings.buffer)
        self._topic = settings.topic.encode()
        self._next_seq = 0
        self._gap_at = 0           # counters.dropped when the last batch was numbered
        self._ctx = zmq.Context()
        self._pub = self._bind(zmq.PUB, settings.endpoint, "--events-endpoint")
        self._replay = (self._bind(zmq.ROUTER, settings.replay_endpoint, "--events-replay-endpoint")
                        if settings.replay_endpoint else None)
        self._thread = threading.Thread(target=self._serve, name="kv-events", daemon=True)
        self._thread.start()

    def _bind(self, kind: int, endpoint: str, flag: str) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, PUB_HWM if kind == zmq.PUB else 2 * (self.settings.buffer + 1))
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            self.close()
            raise ConfigError(f"{flag}: cannot listen on {endpoint}: {exc}") from None
        return sock

    # -- the event loop's side -------------------------------------------------------------------------------
    def submit(self, events: list[Event]) -> None:
        """Hand ``events`` to the thread, or drop and count them when it is that far behind. Never blocks."""
        if self._queue.qsize() >= self.settings.queue:
            self.counters.dropped += len(events)
            return
        self._queue.put(events)

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {"events": c.events, "batches": c.batches, "dropped": c.dropped, "replays": c.replays,
                "queued": self._queue.qsize(), "buffered": len(self._buffer), "next_seq": self._next_seq,
                "incarnation": self.incarnation}

    def close(self, wait: float = 1.0) -> None:
        """Send what is queued (for at most ``wait`` seconds), stop the thread, close the sockets."""
        if getattr(self, "_thread", None) is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(wait)
        for sock in (getattr(self, "_pub", None), getattr(self, "_replay", None)):
            if sock is not None:
                sock.close(linger=0)
        self._ctx.term()

    # -- the thread ------------------------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=IDLE_WAIT_S)
            except queue.Empty:
                self._answer_replays()
                continue
            if first is None:
                return
            events, stop = self._gather(first)
            try:
                self._send(events)
            except zmq.ZMQError as exc:   # the socket is closing, or a send failed: the batch is lost
                logs.warning("kv_events_send_failed", error=str(exc))
            self._answer_replays()
            if stop:
                return

    def _gather(self, events: list[Event]) -> tuple[list[Event], bool]:
        """``events`` and whatever else is queued now, up to a batch; True when the stop marker came too."""
        events = list(events)
        while len(events) < MAX_BATCH_EVENTS:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                break
            if more is None:
                return events, True
            events.extend(more)
        return events, False

    def _send(self, events: list[Event]) -> None:
        dropped = self.counters.dropped
        if dropped != self._gap_at:   # some were dropped since the last batch: leave a gap for consumers
            self._gap_at = dropped
            self._next_seq += 1
        seq = self._next_seq
        self._next_seq += 1
        s = self.settings
        payload = msgpack.packb(batch_body(time.time(), events, s.fmt, self.incarnation))
        self._pub.send_multipart((self._topic, seq_bytes(seq), payload), flags=zmq.NOBLOCK)
        self._buffer.append((seq, payload))
        self.counters.batches += 1
        self.counters.events += len(events)

    def _answer_replays(self) -> None:
        replay = self._replay
        while replay is not None and replay.poll(0):
            frames = replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                logs.warning("kv_events_bad_replay_request", frames=len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    replay.send_multipart((client, b"", self._topic, seq_bytes(seq), payload))
            replay.send_multipart((client, b"", b"", END_SEQ, b""))
            self.counters.replays += 1
