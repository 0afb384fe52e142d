"""Property test of the KV cache events: for any sequence of store operations (the Store state machine of
``test_store_properties.py``: puts, gets, deletes, clears, expiries, write-backs, promotions, GPU copies, every
completion in any order, successful or not), what a consumer rebuilds from the events alone — each batch packed as
the publisher packs it and decoded by vLLM's own classes — is exactly what each tier holds, and so is what a late
joiner rebuilds from a snapshot alone."""

from __future__ import annotations

import msgpack
import msgspec
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, precondition, rule

from kvstore.protocol.kv_events import FORMATS, Event, batch_body, block_hash, encoded_events
from kvstore.store.events import MEDIA, EventLog, media_of, snapshot_events, snapshot_packed
from support.store_machine import StoreMachine
from support.events_consumer import vllm_event_classes

vllm_events = vllm_event_classes()   # vLLM's own decoder: the module is skipped without the vllm wheel
AllBlocksCleared = vllm_events.AllBlocksCleared
BlockRemoved = vllm_events.BlockRemoved
BlockStored = vllm_events.BlockStored
KVEventBatch = vllm_events.KVEventBatch


class Rebuilt:
    """A consumer's view: block hash → media, from vLLM-decoded batches."""

    def __init__(self) -> None:
        self.held: dict[int, set[str]] = {}
        self._decode = msgspec.msgpack.Decoder(type=KVEventBatch)

    def take(self, events: list[Event], namespace: str | None = None) -> None:
        payload = msgpack.packb(batch_body(0.0, events, "map", "0" * 16))
        for event in self._decode.decode(payload).events:
            if isinstance(event, AllBlocksCleared):
                self.held.clear()
            elif isinstance(event, BlockStored):
                for h in event.block_hashes:
                    assert event.medium not in self.held.get(h, set()), "stored twice in one medium"
                    self.held.setdefault(h, set()).add(event.medium)
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    self.held[h].remove(event.medium)   # KeyError: removed from a medium never announced
                    if not self.held[h]:
                        del self.held[h]


class EventsMachine(StoreMachine):
    rebuilt: Rebuilt | None = None

    @invariant()
    def events_describe_every_tier(self) -> None:
        if self.store is None:
            return
        if self.rebuilt is None:   # right after the start rule, before any chunk exists
            self.rebuilt = Rebuilt()
            self.store.publishing.events = EventLog(self.rebuilt.take)
            self.store.publishing.events.all_cleared()
            return
        expected = {}
        for key, entry in self.store.index.items():
            mask = media_of(entry)
            if mask:
                expected[block_hash(key)] = {name for bit, name in MEDIA if mask & bit}
        assert self.rebuilt.held == expected
        fresh = Rebuilt()   # a late joiner: the snapshot alone says the same
        rows = self.store.publishing.events.snapshot()
        events = snapshot_events(rows)
        fresh.take(events)
        assert fresh.held == expected
        packer = msgpack.Packer()   # the publisher's snapshot, from the names each chunk keeps packed: the same bytes
        for fmt in FORMATS:
            count, packed = snapshot_packed(rows, fmt, "0" * 16, packer)
            assert (count, packed) == (len(events), packer.pack(encoded_events(events, fmt, "0" * 16)))

    @precondition(lambda self: self.store is not None)
    @rule()
    def clear(self) -> None:
        self.store.clear("ns")


EventsMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=60, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow], derandomize=True,
                                           database=None)
TestEventsProperties = EventsMachine.TestCase
