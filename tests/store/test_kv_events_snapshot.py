"""The publisher's snapshot, assembled from the names each held chunk keeps packed (``snapshot_packed``), is byte
for byte the packing of the snapshot's events (``snapshot_events``): engine chunks in chains and alone, chunks
named by their keys, in several tiers, in both wire formats; and vLLM's own classes decode it."""

from __future__ import annotations

import os

import msgpack
import msgspec
import pytest

from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.protocol.kv_events import FORMATS, array_header, encoded_events
from kvstore.store.entry import DiskState, Entry, State
from kvstore.store.events import EventLog, snapshot_events, snapshot_packed
from support.events_consumer import vllm_event_classes

vllm_events = vllm_event_classes()   # vLLM's own decoder: the module is skipped without the vllm wheel
BlockStored = vllm_events.BlockStored
KVEventBatch = vllm_events.KVEventBatch


def held_log() -> EventLog:
    """A log holding chains of engine chunks (16 blocks of 16 tokens, some long enough for 16-bit array headers),
    a lone engine chunk, key-named chunks, in DRAM, on disk or both."""
    log = EventLog(lambda events, namespace: None)
    next_hash = 2**40
    for chain in range(6):
        parent = None
        for _ in range(20 if chain == 0 else 3):
            hashes = tuple(range(next_hash, next_hash + 16))
            next_hash += 16
            entry = Entry(os.urandom(16), 512, "ns", None, State.COMMITTED, host_offset=None if chain == 1 else 0,
                          disk=DiskState.STORED if chain in (1, 2) else DiskState.NONE,
                          engine=EngineBlocks(16, hashes, parent, tuple(range(chain, chain + 256))))
            parent = hashes[-1]
            log.changed(entry.key, entry)
    parent_key = None
    for _ in range(5):
        entry = Entry(os.urandom(16), 512, "ns", parent_key, State.COMMITTED, host_offset=0)
        parent_key = entry.key
        log.changed(entry.key, entry)
    small = Entry(os.urandom(16), 512, "ns", None, State.COMMITTED, host_offset=0,
                  engine=EngineBlocks(4, (7,), 3, (1, 2, 3, 4)))
    log.changed(small.key, small)
    return log


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_packed_snapshot_is_the_packed_events(fmt: str) -> None:
    rows = held_log().snapshot()
    events = snapshot_events(rows)
    packer = msgpack.Packer()
    count, packed = snapshot_packed(rows, fmt, "ab" * 8, packer)
    assert count == len(events)
    assert packed == packer.pack(encoded_events(events, fmt, "ab" * 8))
    if fmt == "map":   # vLLM decodes the map form (its array form is the older release's)
        batch = msgspec.msgpack.Decoder(type=KVEventBatch).decode(b"\x93\xcb" + b"\0" * 8 + packed + b"\x00")
        stored = [e for e in batch.events if isinstance(e, BlockStored)]
        assert sum(len(e.block_hashes) for e in stored) == 20 * 16 + 5 * 3 * 16 + 5 + 1 + 16 * 3   # disk and DRAM


def test_an_empty_snapshot_is_the_clear_alone() -> None:
    packer = msgpack.Packer()
    count, packed = snapshot_packed([], "map", "ab" * 8, packer)
    assert count == 1 and packed[:1] == array_header(1)
