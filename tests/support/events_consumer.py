"""A KV cache event consumer that does what the routers do (llm-d's indexer, Dynamo's KV router): subscribe with a
topic filter, take batches in ``seq`` order, ask the replay socket for what a gap skipped, and keep, per block hash,
the media that hold it. Every batch is decoded by vLLM's own classes (``vllm.distributed.kv_events``); the raw
msgpack is read only for the incarnation id, which vLLM's decoder ignores."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import msgspec
import zmq

from harness.servers import require_module

def vllm_event_classes():
    """vLLM's own KV event module (``vllm.distributed.kv_events``); the calling test is skipped with the reason
    (failed under CI) where the vllm wheel is not installed."""
    return require_module("vllm.distributed.kv_events", "vLLM's KV event classes (the vllm wheel)")


END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass
class Consumer:
    endpoint: str
    replay_endpoint: str
    topic: str = ""
    exact: bool = False         # one stream: drop other topics the prefix lets through, replay this topic's
    held: dict[int, set[str]] = field(default_factory=dict)
    next_seq: int = 0
    batches: int = 0
    replayed: int = 0
    gaps: int = 0               # gaps replay could not fill (batches dropped by the publisher)
    incarnations: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)   # every event's type, in order
    # per block hash stored: (parent block hash, its token ids, block size), as llm-d keeps them to rehash
    blocks: dict[int, tuple[int | None, list[int], int]] = field(default_factory=dict)
    ranks: set[int] = field(default_factory=set)    # every batch's data_parallel_rank
    # events of a KV cache group (``group_idx``: a hybrid model's): per block hash, per group, the media holding
    # it; a block is ``held`` in the media where every group seen holds it, which is what a load can use
    by_group: dict[int, dict[int, set[str]]] = field(default_factory=dict)
    group_kinds: dict[int, str] = field(default_factory=dict)   # group_idx -> its kv_cache_spec_kind
    payloads: list[bytes] = field(default_factory=list)   # every batch applied, as sent

    def __post_init__(self) -> None:
        # first, before any socket: a skip raised with a context open would leave it for the garbage collector,
        # whose term() blocks on the open socket in whatever test runs then
        self._events = vllm_event_classes()
        self._decode = msgspec.msgpack.Decoder(type=self._events.KVEventBatch)
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt_string(zmq.SUBSCRIBE, self.topic)
        self._sub.connect(self.endpoint)

    def close(self) -> None:
        self._sub.close(linger=0)
        self._ctx.term()

    def pump(self, until_seq: int, incarnation: str, timeout: float = 20.0) -> None:
        """Apply batches until ``until_seq`` of the publisher's ``incarnation`` has been applied (replaying what was
        published before we joined, or since the last batch, when nothing live comes)."""
        deadline = time.monotonic() + timeout
        while self.next_seq <= until_seq or not self.incarnations or self.incarnations[-1] != incarnation:
            if time.monotonic() > deadline:
                raise AssertionError(f"no batch {until_seq} after {timeout}s (applied up to {self.next_seq - 1})")
            if not self._sub.poll(100):
                self._replay()   # slow joiner: what was published before we connected
                continue
            self._take_one()

    def _take_one(self) -> None:
        topic, seq_b, payload = self._sub.recv_multipart()
        assert topic.decode().startswith(self.topic)
        if self.exact and topic != self.topic.encode():
            return
        seq = int.from_bytes(seq_b, "big")
        if self.incarnations and _incarnation(payload) != self.incarnations[-1]:
            self.next_seq = 0   # the publisher restarted: its sequence begins again, from its clear
        if seq > self.next_seq:
            self._replay()
        if seq == self.next_seq:
            self._apply(seq, payload)
        elif seq > self.next_seq:   # replay had not got it: a batch the publisher dropped
            self.gaps += 1
            self._apply(seq, payload)

    def take_snapshot(self) -> int:
        """Ask for everything held now (kvstore's snapshot on the replay socket); returns the seq it reflects.
        Live batches up to that seq are skipped from here on."""
        req = self._ctx.socket(zmq.DEALER)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(self.replay_endpoint)
        try:
            req.send_multipart([b"", b"snapshot", *self._topic_frame()])
            assert req.poll(10_000), "no snapshot"
            _, _topic, seq_b, payload = req.recv_multipart()
            assert seq_b != END_SEQ, "the daemon sent no snapshot"
            seq = int.from_bytes(seq_b, "big")
            self._apply(seq, payload)
            assert req.poll(10_000) and req.recv_multipart()[2] == END_SEQ
            return seq
        finally:
            req.close(linger=0)

    def take_live(self, seconds: float) -> None:
        """Apply what arrives live within ``seconds`` (replaying whatever a gap skipped)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self._sub.poll(20):
            self._take_one()

    def _replay(self) -> None:
        req = self._ctx.socket(zmq.DEALER)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(self.replay_endpoint)
        try:
            req.send_multipart([b"", self.next_seq.to_bytes(8, "big"), *self._topic_frame()])
            while True:
                if not req.poll(5000):
                    raise AssertionError("the replay socket did not answer")
                _, _topic, seq_b, payload = req.recv_multipart()
                if seq_b == END_SEQ:
                    return
                seq = int.from_bytes(seq_b, "big")
                if self.incarnations and _incarnation(payload) != self.incarnations[-1] and self.next_seq:
                    self.next_seq = 0   # a new publisher answers: take its stream from its beginning
                    req.send_multipart([b"", b"\0" * 8, *self._topic_frame()])
                    continue
                if seq < self.next_seq:
                    continue
                if seq > self.next_seq:
                    self.gaps += 1
                self._apply(seq, payload)
                self.replayed += 1
        finally:
            req.close(linger=0)

    def _topic_frame(self) -> list[bytes]:
        """The replay request's topic frame: this stream's when it is one topic, none (the daemon-wide) else."""
        return [self.topic.encode()] if self.exact else []

    def _apply(self, seq: int, payload: bytes) -> None:
        batch = self._decode.decode(payload)   # vLLM's classes decode every batch
        self.ranks.add(batch.data_parallel_rank)
        self.payloads.append(payload)
        inc = _incarnation(payload)
        if not self.incarnations or self.incarnations[-1] != inc:
            self.incarnations.append(inc)
        for event in batch.events:
            self.kinds.append(type(event).__name__)
            self._apply_event(event)
        self.next_seq = seq + 1
        self.batches += 1

    def _apply_event(self, event: object) -> None:
        if isinstance(event, self._events.AllBlocksCleared):
            self.held.clear()
            self.by_group.clear()
        elif getattr(event, "group_idx", None) is not None:
            self._apply_group_event(event)
        elif isinstance(event, self._events.BlockStored):
            assert event.medium in ("GPU", "CPU", "STORAGE")
            size, tokens = event.block_size, list(event.token_ids)
            assert not tokens or len(tokens) == size * len(event.block_hashes)
            parent = event.parent_block_hash
            for i, h in enumerate(event.block_hashes):
                self.held.setdefault(h, set()).add(event.medium)
                self.blocks[h] = (parent, tokens[i * size:(i + 1) * size], size)
                parent = h
        elif isinstance(event, self._events.BlockRemoved):
            for h in event.block_hashes:
                media = self.held.get(h, set())
                assert event.medium in media, f"removed {h} from {event.medium}, which did not hold it"
                media.discard(event.medium)
                if not media:
                    del self.held[h]

    def _apply_group_event(self, event: Any) -> None:
        group = event.group_idx
        stored = isinstance(event, self._events.BlockStored)
        if stored:
            self.group_kinds[group] = event.kv_cache_spec_kind
            size, tokens, parent = event.block_size, list(event.token_ids), event.parent_block_hash
        for i, h in enumerate(event.block_hashes):
            media = self.by_group.setdefault(h, {}).setdefault(group, set())
            if stored:
                media.add(event.medium)
                self.blocks[h] = (parent, tokens[i * size:(i + 1) * size], size)
                parent = h
            else:
                assert event.medium in media, f"removed {h} of group {group} from {event.medium}, not held there"
                media.discard(event.medium)
            groups = self.by_group[h]
            for g in [g for g, m in groups.items() if not m]:
                del groups[g]
            usable = set.intersection(*groups.values()) if len(groups) == len(self.group_kinds) else set()
            if usable:
                self.held[h] = usable
            else:
                self.held.pop(h, None)
            if not groups:
                del self.by_group[h]



def _incarnation(payload: bytes) -> str:
    """The publisher's incarnation id, which every event of a batch carries (map key or last element)."""
    found = {raw["kvstore_incarnation"] if isinstance(raw, dict) else raw[-1] for raw in msgpack.unpackb(payload)[1]}
    assert len(found) == 1, f"one batch, one incarnation: {found}"
    return found.pop()
