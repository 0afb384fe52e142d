"""The KV cache event publisher: a ZeroMQ PUB socket written on the event loop, and a ROUTER for replay served
by a thread of its own.

Publishing never waits. A change to the Store only notes the key (``store/events.py``: ``EventLog.changed``) and
wakes the publisher (``wake``); at the end of that turn of the event loop (``flush``, scheduled with
``call_soon``; before the loop runs, at start-up, at once) the log turns the keys noted into events (``drain``),
which are sent as one batch: one msgpack pack and one non-blocking send. Batches go out at most once per
``BATCH_INTERVAL_S``: a change within that time of the last flush waits for the rest of it (``call_later``), so a
busy daemon sends one batch of many turns' changes where it would send one per turn. Every batch costs its pack,
three frames and, for ZeroMQ's I/O thread asleep between batches, a wake-up of that thread, whatever it carries;
a change after a quiet spell still goes out at the end of its turn. The PUB socket never blocks a send: a
subscriber more than ``--events-hwm`` batches behind loses the batches past that in ZeroMQ, and sees the gap in
``seq`` (it can ask the replay socket for them). A send the socket refuses outright is counted as dropped
(``kvstore_events_dropped_total``) and leaves its sequence number unused on the wire, a gap too. Sending on the
loop thread rather than a sender thread keeps the loop from ever waiting for another thread to hand back the
interpreter lock, which on a loaded machine costs far more than the pack and send themselves.

The last ``--events-buffer`` batches are kept for replay; the replay thread answers requests from a copy of that
buffer taken under a lock (``protocol/kv_events.py`` has the protocol and the formats).

Streams (``event_topics.py``): every batch goes on the daemon-wide stream, and a batch of a namespace with
connected engines also on each engine's topic, at its rank. Each topic numbers its own batches. The events of a
batch are packed once; each distinct rank adds only the batch's few framing bytes around them
(``batch_bytes``), and engines of one rank share one payload.
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

from ... import logs
from ...defaults import EVENTS_BUFFER, EVENTS_FORMAT, EVENTS_HWM
from ...errors import ConfigError
from ...protocol.engine_identity import EngineIdentity
from ...protocol.kv_events import (
    END_SEQ, SNAPSHOT_REQUEST, Event, array_header, batch_bytes, encoded_events, seq_bytes,
)
from ...store.events import Holding, snapshot_packed
from ...tenants.table import DEFAULT_TENANT
from ...protocol.event_topics import DEFAULT_TOPIC, Audience, Target, TopicTemplate

REPLAY_POLL_MS = 200     # how long the replay thread waits for a request before it looks for the stop flag
SNAPSHOT_WAIT_S = 5.0    # how long a snapshot request waits for the event loop to copy the holdings
MAX_BATCH_EVENTS = 4096  # events packed into one batch at most
BATCH_INTERVAL_S = 0.002  # batches go out at most this often; the first after a quiet spell at once
_MORE = zmq.SNDMORE | zmq.NOBLOCK


@dataclass(frozen=True)
class EventSettings:
    endpoint: str
    replay_endpoint: str = ""
    buffer: int = EVENTS_BUFFER   # batches kept for replay
    hwm: int = EVENTS_HWM         # batches ZeroMQ queues per subscriber before it drops for that one
    fmt: str = EVENTS_FORMAT
    topic: str = DEFAULT_TOPIC    # a plain topic or a template (event_topics.py)


@dataclass(frozen=True)
class OwnSocketFile:
    """An ``ipc://`` socket file a bind of this daemon made, known by its inode: removed at a clean stop only
    while it is still that file (never one another process bound there since)."""

    path: str
    device: int
    inode: int

    @classmethod
    def of(cls, path: str) -> "OwnSocketFile | None":
        """The file just bound at ``path`` (None: no file there, as for an abstract ``ipc://@name``)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(path, st.st_dev, st.st_ino)

    def remove(self) -> None:
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == (self.device, self.inode):
                os.unlink(self.path)
        except OSError:
            pass


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
        self._pending: list[tuple[str | None, list[Event]]] = []   # (namespace, its events), in order
        self._pending_events = 0
        self._scheduled = False
        self._last_flush = 0.0   # time.monotonic() of the last flush
        self._packer = msgpack.Packer()   # used on the event loop only
        self._buffer: deque[tuple[bytes, int, bytes]] = deque(maxlen=settings.buffer)   # (topic, seq, payload)
        self._buffer_lock = threading.Lock()   # the loop appends, the replay thread copies
        self.audience = Audience(TopicTemplate.parse(settings.topic))
        self._topic = self.audience.template.plain   # the daemon-wide stream's
        self._seqs: dict[bytes, int] = {}   # the next seq of each topic
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # the Store's event log's (of the namespaces given; None: all)
        self.holdings: Callable[[list[str] | None], list[tuple[bytes, Holding]]] | None = None
        self.drain: Callable[[], None] | None = None   # the Store's event log's: its changes become events
        self.noted: Callable[[], int] | None = None   # the Store's event log's: keys changed, not yet drained
        self._thread: threading.Thread | None = None
        self._ctx = zmq.Context()
        self._pub: zmq.Socket | None = None
        self._replay: zmq.Socket | None = None
        self._socket_files: list[OwnSocketFile] = []   # the ipc:// files this daemon's binds made
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
        if endpoint.startswith("ipc://"):
            made = OwnSocketFile.of(endpoint[len("ipc://"):])
            if made is not None:
                self._socket_files.append(made)
        return sock

    # -- the event loop's side -------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop serves: snapshots are taken on it from now on."""
        self._loop = loop

    def submit(self, events: list[Event], namespace: str | None = None) -> None:
        """Add ``events`` (of ``namespace``; None: of every namespace) to the batch this turn of the event loop
        sends (at once when no loop runs)."""
        last = self._pending[-1] if self._pending else None
        if last is not None and last[0] == namespace:
            last[1].extend(events)
        else:
            self._pending.append((namespace, list(events)))
        self._pending_events += len(events)
        if self._pending_events >= MAX_BATCH_EVENTS:
            self._send_pending()
            return
        self.wake()

    def wake(self) -> None:
        """Something is to be sent: flush at the end of this turn of the event loop, or once ``BATCH_INTERVAL_S``
        has passed since the last flush when that is later (at once when no loop runs; start-up: the adopted chunks
        are announced as they are found)."""
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._scheduled = True
        wait = self._last_flush + BATCH_INTERVAL_S - time.monotonic()
        if wait > 0:
            loop.call_later(wait, self.flush)
        else:
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Drain the Store's event log (``drain``: the keys changed this turn become events), then send what was
        gathered. Never blocks."""
        self._scheduled = True   # what the drain submits joins this flush rather than scheduling another
        self._last_flush = time.monotonic()
        try:
            if self.drain is not None:
                self.drain()
        finally:
            self._scheduled = False
        self._send_pending()

    def _send_pending(self) -> None:
        """Send what was gathered: one batch on the daemon-wide stream, and per engine of a namespace changed one
        batch of that namespace's events on its topic; numbered per topic and kept for replay."""
        groups, self._pending, self._pending_events = self._pending, [], 0
        if not groups or self._pub is None:
            return
        ts = time.time()
        everywhere = [Target(self._topic)]
        if len(groups) == 1:   # the usual turn: one namespace changed, one packed body for every stream
            namespace, events = groups[0]
            self._publish(ts, self._pack(events), len(events), everywhere + self.audience.targets(namespace))
            return
        parts = [(namespace, len(events), self._pack_elements(events)) for namespace, events in groups]
        total = sum(count for _, count, _ in parts)
        self._publish(ts, array_header(total) + b"".join(body for _, _, body in parts), total, everywhere)
        for namespace, count, body in parts:
            engines = self.audience.targets(namespace)
            if engines:
                self._publish(ts, array_header(count) + body, count, engines)

    def _pack(self, events: list[Event]) -> bytes:
        """The packed ``events`` element of a batch."""
        return self._packer.pack(encoded_events(events, self.settings.fmt, self.incarnation))

    def _pack_elements(self, events: list[Event]) -> bytes:
        """``events`` packed one after the other, without the array header (joined under one by the caller)."""
        pack = self._packer.pack
        return b"".join(pack(e) for e in encoded_events(events, self.settings.fmt, self.incarnation))

    def _publish(self, ts: float, packed: bytes, count: int, targets: list[Target]) -> None:
        """One batch of ``count`` events (``packed``: its events element) on each of ``targets``, framed once per
        distinct rank."""
        payloads: dict[int, bytes] = {}
        for target in dict.fromkeys(targets):   # an engine named twice (same topic and rank) is sent to once
            payload = payloads.get(target.rank)
            if payload is None:
                payload = payloads[target.rank] = batch_bytes(self._packer, ts, packed, target.rank)
            self._send(target.topic, payload, count)

    def _send(self, topic: bytes, payload: bytes, count: int) -> None:
        seq = self._seqs.get(topic, 0)
        self._seqs[topic] = seq + 1
        pub = self._pub
        assert pub is not None
        try:   # three plain sends: send_multipart's per-frame checks cost more than the sends here
            pub.send(topic, _MORE)
            pub.send(seq_bytes(seq), _MORE)
            pub.send(payload, zmq.NOBLOCK)
            self.counters.batches += 1
            self.counters.events += count
        except zmq.ZMQError:   # refused (closing, or no room): a gap on the wire, still in the replay buffer
            self.counters.dropped += count
        with self._buffer_lock:
            self._buffer.append((topic, seq, payload))

    def engine_joined(self, namespace: str, identity: EngineIdentity, tenant: str = DEFAULT_TENANT) -> None:
        """A session of ``identity`` opened in ``namespace`` (owned by ``tenant``): when it is the engine's first
        there, its stream starts with ``AllBlocksCleared`` and what the namespace holds now, on its topic alone."""
        self.flush()   # what changed before goes out without it: the holdings below include it
        target = self.audience.join(namespace, identity, tenant)
        if target is None or self._pub is None:
            return
        rows = self.holdings([namespace]) if self.holdings is not None else []
        count, packed = snapshot_packed(rows, self.settings.fmt, self.incarnation, self._packer)
        self._publish(time.time(), packed, count, [target])

    def engine_left(self, namespace: str, identity: EngineIdentity) -> None:
        """A session of ``identity`` in ``namespace`` closed (the last one ends its stream)."""
        self.flush()   # what changed while it was there still reaches it
        self.audience.leave(namespace, identity)

    def stats(self) -> dict[str, Any]:
        """Counters for ``kvstore stats``; ``pending`` is what is not on the wire yet (events gathered, and keys
        changed but not yet turned into events): 0 once every change so far was sent."""
        c = self.counters
        return {"events": c.events, "batches": c.batches, "dropped": c.dropped, "replays": c.replays,
                "snapshots": c.snapshots,
                "pending": self._pending_events + (self.noted() if self.noted is not None else 0),
                "buffered": len(self._buffer),
                "next_seq": self._seqs.get(self._topic, 0), "engines": self.audience.engines(),
                "engine_topics": self.audience.topics(), "topics": len(self._seqs), "incarnation": self.incarnation}

    def close(self) -> None:
        """Send what is gathered, stop the replay thread, close the sockets and remove the ``ipc://`` socket files
        the binds made (a file since replaced by another process's is left alone)."""
        if self._pub is not None:
            self.flush()
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(2 * REPLAY_POLL_MS / 1000)
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
        self._ctx.term()
        for made in self._socket_files:   # ZeroMQ leaves an ipc:// socket file behind; only ours goes
            made.remove()
        self._socket_files = []

    def _copy_holdings(self, topic: bytes, done: concurrent.futures.Future) -> None:
        """On the loop: send what is gathered, then copy what ``topic``'s stream holds (consistent with the last
        seq sent on it), with the rank its batches carry."""
        try:
            self.flush()
            namespaces, rank = (None, 0) if topic == self._topic else self.audience.namespaces_of(topic)
            rows = self.holdings(namespaces) if self.holdings is not None else []
            done.set_result((self._seqs.get(topic, 0) - 1, rank, rows))
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
            try:
                self._answer(replay, replay.recv_multipart(), packer)
            except Exception as exc:   # noqa: BLE001 - one bad request must not end the replay thread
                logs.warning("kv_events_replay_failed", error=str(exc))

    def _answer(self, replay: zmq.Socket, frames: list[bytes], packer: msgpack.Packer) -> None:
        """One replay or snapshot request: ``[client, b"", ask]`` or ``[client, b"", ask, topic]``."""
        if len(frames) not in (3, 4):
            logs.warning("kv_events_bad_replay_request", frames=len(frames))
            return
        client, ask = frames[0], frames[2]
        topic = frames[3] if len(frames) == 4 else self._topic
        if topic not in self._seqs and self._topic.startswith(topic):
            topic = self._topic   # a prefix of the daemon-wide stream's topic (``kvstore events --topic``) names it
        if ask == SNAPSHOT_REQUEST:
            self._answer_snapshot(replay, client, topic, packer)
        elif len(ask) == 8:
            self._answer_replay(replay, client, topic, int.from_bytes(ask, "big"))
        else:
            logs.warning("kv_events_bad_replay_request", frames=len(frames))

    def _answer_replay(self, replay: zmq.Socket, client: bytes, topic: bytes, first: int) -> None:
        """``topic``'s buffered batches from ``first`` on, then the end marker."""
        with self._buffer_lock:
            batches = [(seq, payload) for t, seq, payload in self._buffer if t == topic and seq >= first]
        for seq, payload in batches:
            replay.send_multipart((client, b"", topic, seq_bytes(seq), payload))
        replay.send_multipart((client, b"", b"", END_SEQ, b""))
        self.counters.replays += 1

    def _answer_snapshot(self, replay: zmq.Socket, client: bytes, topic: bytes, packer: msgpack.Packer) -> None:
        """One batch of everything ``topic``'s stream holds now (built and packed here, off the loop), then the end
        marker; only the end marker when the loop does not answer (not serving yet, or stopping) or nothing was
        ever published on ``topic``."""
        loop = self._loop
        done: concurrent.futures.Future[tuple[int, int, list[tuple[bytes, Holding]]]] = concurrent.futures.Future()
        try:
            if loop is None:
                raise RuntimeError("not serving yet")
            loop.call_soon_threadsafe(self._copy_holdings, topic, done)
            seq, rank, rows = done.result(SNAPSHOT_WAIT_S)
        except (RuntimeError, concurrent.futures.TimeoutError) as exc:
            logs.warning("kv_events_snapshot_failed", error=str(exc) or "timed out")
        else:
            if seq < 0:   # nothing was ever published on this topic: there is no stream to snapshot
                replay.send_multipart((client, b"", b"", END_SEQ, b""))
                return
            _, packed = snapshot_packed(rows, self.settings.fmt, self.incarnation, packer)
            payload = batch_bytes(packer, time.time(), packed, rank)
            replay.send_multipart((client, b"", topic, seq_bytes(seq), payload), copy=False)
            self.counters.snapshots += 1
        replay.send_multipart((client, b"", b"", END_SEQ, b""))
