"""What every engine holds, learned from the KV cache events of several daemons (``docs/operations/events.md``).

One SUB socket per daemon, subscribed to every topic; each (daemon, topic) is a stream of its own: an engine's
topic (``kv@{engine_id}@{model}``) or the daemon-wide one. Per stream the index keeps, for each block hash, the
media holding it (``GPU``, ``CPU``, ``STORAGE``), applying ``BlockStored``, ``BlockRemoved`` and
``AllBlocksCleared`` in ``seq`` order. It never trusts a stream it has lost track of:

* a batch whose ``seq`` skips some: the missing ones are asked of the daemon's replay socket (for that topic);
  when replay cannot fill the gap (they left its buffer), the stream is rebuilt from a snapshot;
* a stream first met past its beginning (the index started after the daemon): rebuilt from a snapshot;
* a new incarnation id (the daemon restarted): the stream is dropped and taken from the new incarnation's
  batches, from its first (replay from 0) or from a snapshot.

``pump`` applies what has arrived, without waiting unless asked to; the router calls it before each decision.
Decoding takes vLLM's map and array forms alike (``protocol/kv_events.py``). Not thread-safe: one caller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import msgpack
import zmq

from .. import logs
from ..errors import DaemonUnavailable, UsageError
from ..protocol.kv_events import END_SEQ, INCARNATION_KEY, SNAPSHOT_REQUEST, split_batch

REPLAY_TIMEOUT_S = 2.0
MEDIA = ("GPU", "CPU", "STORAGE")
# (source, the replay request's frames after the empty one) -> the batches answered, as (topic, seq, payload)
Ask = Callable[["EventSource", list[bytes]], list[tuple[bytes, int, bytes]]]


@dataclass(frozen=True)
class EventSource:
    """One daemon's event sockets: its ``--events-endpoint`` and ``--events-replay-endpoint``."""

    name: str
    endpoint: str
    replay_endpoint: str = ""


@dataclass
class Stream:
    """One (daemon, topic) stream: where it is, and what it says is held."""

    next_seq: int = 0
    incarnation: str = ""
    held: dict[int, set[str]] = field(default_factory=dict)   # block hash -> media
    rebuilt: int = 0      # snapshots taken
    replayed: int = 0     # batches replayed


class EventsIndex:
    """Block hashes held per engine stream, per medium, fed by several daemons' KV cache events.

    Args:
        sources: the daemons to follow.
        ask: how replay and snapshot requests are sent (tests replace it); by default a DEALER to the source's
            replay endpoint.
    Raises:
        UsageError: no source, two of one name, or an endpoint that is not ``tcp://`` or ``ipc://``.
    """

    def __init__(self, sources: Sequence[EventSource], ask: Ask | None = None) -> None:
        if not sources:
            raise UsageError("an events index needs at least one daemon to follow")
        if len({s.name for s in sources}) != len(sources):
            raise UsageError(f"daemon names must be distinct, got {[s.name for s in sources]}")
        for s in sources:
            for endpoint in filter(None, (s.endpoint, s.replay_endpoint)):
                if not endpoint.startswith(("tcp://", "ipc://")):
                    raise UsageError(f"daemon {s.name!r}: endpoint must start with tcp:// or ipc://, got {endpoint!r}")
        self.sources = {s.name: s for s in sources}
        self.streams: dict[tuple[str, bytes], Stream] = {}
        self._ctx = zmq.Context()
        self._ask = ask or self._ask_replay_socket
        self._subs: dict[str, zmq.Socket] = {}
        for s in sources:
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(s.endpoint)
            self._subs[s.name] = sub
        self._poller = zmq.Poller()
        for sub in self._subs.values():
            self._poller.register(sub, zmq.POLLIN)

    # -- reading ---------------------------------------------------------------------------------------------
    def media(self, source: str, topic: bytes, block_hash: int) -> set[str]:
        """The media holding ``block_hash`` in that stream (empty: none)."""
        stream = self.streams.get((source, topic))
        return stream.held.get(block_hash, set()) if stream is not None else set()

    def held_prefix(self, source: str, topic: bytes, hashes: Sequence[int]) -> list[set[str]]:
        """The media of each leading block of ``hashes`` the stream holds, up to the first it does not."""
        stream = self.streams.get((source, topic))
        if stream is None:
            return []
        out = []
        for h in hashes:
            media = stream.held.get(h)
            if not media:
                break
            out.append(media)
        return out

    # -- following -------------------------------------------------------------------------------------------
    def pump(self, timeout: float = 0.0) -> int:
        """Apply every batch that has arrived (waiting up to ``timeout`` seconds for the first); returns how many
        were applied."""
        applied = 0
        wait_ms = int(timeout * 1000)
        deadline = time.monotonic() + timeout
        while True:
            ready = dict(self._poller.poll(wait_ms))
            if not ready:
                return applied
            for name, sub in self._subs.items():
                while sub in ready and sub.poll(0):
                    topic, seq, payload = sub.recv_multipart()
                    applied += self.take(name, topic, int.from_bytes(seq, "big"), payload)
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))

    def take(self, source: str, topic: bytes, seq: int, payload: bytes) -> int:
        """One live batch of ``source``'s ``topic``: applied in order, after what a gap skipped (replayed, or a
        snapshot when replay cannot give it); returns how many batches were applied."""
        key = (source, topic)
        stream = self.streams.setdefault(key, Stream())
        events = _decode(payload)
        incarnation = _incarnation(events)
        if stream.incarnation and incarnation and incarnation != stream.incarnation:
            logs.info("events_index_restart", source=source, topic=topic.decode(errors="replace"))
            stream = self.streams[key] = Stream()   # the daemon restarted: its stream begins again
        if seq < stream.next_seq:
            return 0   # had it already (replayed before it arrived live)
        applied = 0
        if seq > stream.next_seq:
            applied += self._catch_up(source, topic, stream, seq)
            if seq < stream.next_seq:
                return applied
        self._apply_events(stream, seq, events)
        return applied + 1

    def watch(self, source: str, topic: str | bytes) -> int:
        """Learn what ``source``'s ``topic`` holds now, without waiting for its next live batch: its buffered
        batches replayed from where the stream is, or a snapshot when the buffer lost some. Returns the batches
        applied. The router watches each engine it routes to when it starts."""
        topic = topic.encode() if isinstance(topic, str) else topic
        stream = self.streams.setdefault((source, topic), Stream())
        return self._catch_up(source, topic, stream, None)

    def _catch_up(self, source: str, topic: bytes, stream: Stream, seq: int | None) -> int:
        """Fill ``stream`` up to ``seq`` (exclusive; None: as far as the daemon has published): replay when the
        replay socket still has every batch, else a snapshot. Returns the batches applied."""
        batches = self._request(source, [stream.next_seq.to_bytes(8, "big"), topic])
        mine = [(s, p) for t, s, p in batches if t == topic and (seq is None or s < seq)]
        gapless = all(s == stream.next_seq + i for i, (s, _) in enumerate(mine))
        if gapless and (len(mine) == seq - stream.next_seq if seq is not None else True):
            for s, p in mine:
                self._apply(stream, s, p)
            stream.replayed += len(mine)
            return len(mine)
        return self._rebuild(source, topic, stream)

    def _rebuild(self, source: str, topic: bytes, stream: Stream) -> int:
        """Replace ``stream``'s holdings by a snapshot (it starts with ``AllBlocksCleared``)."""
        for t, s, p in self._request(source, [SNAPSHOT_REQUEST, topic]):
            if t == topic:
                stream.held.clear()
                self._apply(stream, s, p)
                stream.rebuilt += 1
                return 1
        return 0

    def _request(self, source: str, frames: list[bytes]) -> list[tuple[bytes, int, bytes]]:
        s = self.sources[source]
        if not s.replay_endpoint:
            return []
        try:
            return self._ask(s, frames)
        except DaemonUnavailable as exc:
            logs.warning("events_index_replay_failed", source=source, error=str(exc))
            return []

    def _apply(self, stream: Stream, seq: int, payload: bytes) -> None:
        self._apply_events(stream, seq, _decode(payload))

    @staticmethod
    def _apply_events(stream: Stream, seq: int, events: list[dict[str, Any]]) -> None:
        for event in events:
            _apply_event(stream.held, event)
        stream.incarnation = _incarnation(events) or stream.incarnation
        stream.next_seq = seq + 1

    def _ask_replay_socket(self, source: EventSource, frames: list[bytes]) -> list[tuple[bytes, int, bytes]]:
        req = self._ctx.socket(zmq.DEALER)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(source.replay_endpoint)
        out: list[tuple[bytes, int, bytes]] = []
        try:
            req.send_multipart([b"", *frames])
            while True:
                if not req.poll(int(REPLAY_TIMEOUT_S * 1000)):
                    raise DaemonUnavailable(f"the replay socket of {source.name!r} did not answer")
                answer = req.recv_multipart()
                if len(answer) != 4 or answer[2] == END_SEQ:
                    return out
                out.append((answer[1], int.from_bytes(answer[2], "big"), answer[3]))
        finally:
            req.close(linger=0)

    def close(self) -> None:
        for sub in self._subs.values():
            sub.close(linger=0)
        self._subs.clear()
        self._ctx.term()

    def __enter__(self) -> "EventsIndex":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _apply_event(held: dict[int, set[str]], event: dict[str, Any]) -> None:
    kind = event["type"]
    if kind == "AllBlocksCleared":
        held.clear()
    elif kind == "BlockStored":
        for h in event.get("block_hashes") or ():
            held.setdefault(h, set()).add(event.get("medium") or "GPU")
    else:
        medium = event.get("medium") or "GPU"
        for h in event.get("block_hashes") or ():
            media = held.get(h)
            if media is not None:
                media.discard(medium)
                if not media:
                    del held[h]


def _decode(payload: bytes) -> list[dict[str, Any]]:
    """A batch's events as maps (map or array form); none for a payload that is not an ``EventBatch``."""
    try:
        return split_batch(msgpack.unpackb(payload))[1]
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        logs.warning("events_index_bad_batch", error=str(exc)[:200])
        return []


def _incarnation(events: list[dict[str, Any]]) -> str:
    """The publisher's incarnation id the batch's events carry ("" when they carry none: not a kvstore daemon)."""
    value = events[0].get(INCARNATION_KEY) if events else None
    return value if isinstance(value, str) else ""


def follow(index: EventsIndex, seconds: float, until: Callable[[], bool] | None = None) -> None:
    """Pump ``index`` for up to ``seconds`` (stopping early once ``until()`` holds)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        index.pump(0.05)
        if until is not None and until():
            return

