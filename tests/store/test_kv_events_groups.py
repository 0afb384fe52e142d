"""Chunks of an engine that named its KV cache groups at hello (a hybrid model: attention KV and recurrent state in
one chunk) are published once per group, as vLLM publishes its own hybrid blocks: each event with its
``group_idx`` and the group's kind, every group's events of a chunk together, in and out of a tier, in live
batches and in snapshots. Decoded by vLLM's own classes."""

from __future__ import annotations

import os

import msgpack
import msgspec
import pytest

from kvstore.errors import BadRequestError, LimitError
from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.protocol.engine_identity import EngineIdentity, read_identity
from kvstore.protocol.kv_events import encoded_events
from kvstore.store.entry import DiskState, Entry, State
from kvstore.store.events import EventLog, snapshot_events, snapshot_packed
from support.events_consumer import vllm_event_classes

vllm_events = vllm_event_classes()   # vLLM's own decoder: the module is skipped without the vllm wheel
GROUPS = (("full_attention", None), ("mamba", None))
BLOCK = 256   # a hybrid model's block: one engine block a chunk


def decoded(events: list, incarnation: str = "ab" * 8) -> list:
    """``events`` as vLLM decodes them from a batch."""
    body = [1.0, encoded_events(events, "map", incarnation), 0]
    return msgspec.msgpack.Decoder(type=vllm_events.KVEventBatch).decode(msgpack.packb(body)).events


def chain(namespace: str, n: int, first_hash: int = 2**40) -> list[Entry]:
    parent, out = None, []
    for i in range(n):
        h = first_hash + i
        out.append(Entry(os.urandom(16), 512, namespace, None, State.COMMITTED, host_offset=0,
                         engine=EngineBlocks(BLOCK, (h,), parent, tuple(range(i, i + BLOCK)))))
        parent = h
    return out


def test_a_hybrid_chunk_is_stored_and_removed_in_every_group_together() -> None:
    sent: list = []
    log = EventLog(lambda events, namespace: sent.extend(events))
    log.note_groups("hy", GROUPS)
    entries = chain("hy", 3)
    log.changed_many([(e.key, e) for e in entries])
    stored = decoded(sent)
    assert [(e.group_idx, e.kv_cache_spec_kind, e.block_hashes) for e in stored] == [
        (0, "full_attention", [2**40, 2**40 + 1, 2**40 + 2]), (1, "mamba", [2**40, 2**40 + 1, 2**40 + 2])]
    assert all(e.medium == "CPU" and e.block_size == BLOCK and e.parent_block_hash is None for e in stored)
    assert stored[0].token_ids == stored[1].token_ids == [t for i in range(3) for t in range(i, i + BLOCK)]
    sent.clear()
    log.changed(entries[-1].key, None)            # the last chunk evicted: its attention KV and state at once
    removed = decoded(sent)
    assert [(type(e).__name__, e.group_idx, e.block_hashes) for e in removed] == [
        ("BlockRemoved", 0, [2**40 + 2]), ("BlockRemoved", 1, [2**40 + 2])]


def test_a_namespace_without_groups_is_published_as_before() -> None:
    sent: list = []
    log = EventLog(lambda events, namespace: sent.extend(events))
    log.note_groups("hy", GROUPS)
    entries = chain("dense", 2)
    log.changed_many([(e.key, e) for e in entries])
    (event,) = decoded(sent)
    assert event.group_idx is None and event.kv_cache_spec_kind is None and len(event.block_hashes) == 2
    assert "group_idx" not in msgpack.unpackb(msgpack.packb(encoded_events(sent, "map", "ab" * 8)))[0]


def test_a_snapshot_of_hybrid_chunks_names_every_group() -> None:
    log = EventLog(lambda events, namespace: None)
    log.note_groups("hy", GROUPS)
    for entry in chain("dense", 2, 2**50) + chain("hy", 2):
        entry.disk = DiskState.STORED
        log.changed(entry.key, entry)
    rows = log.snapshot()
    packer = msgpack.Packer()
    count, packed = snapshot_packed(rows, "map", "ab" * 8, packer)
    events = snapshot_events(rows)
    assert count == len(events) and packed == packer.pack(encoded_events(events, "map", "ab" * 8))
    batch = msgspec.msgpack.Decoder(type=vllm_events.KVEventBatch).decode(b"\x93\xcb" + b"\0" * 8 + packed + b"\x00")
    stored = [(e.medium, e.group_idx, e.kv_cache_spec_kind, len(e.block_hashes)) for e in batch.events
              if isinstance(e, vllm_events.BlockStored)]
    for medium in ("CPU", "STORAGE"):
        assert [s[1:] for s in stored if s[0] == medium] == [(None, None, 2), (0, "full_attention", 2),
                                                            (1, "mamba", 2)]


def test_the_groups_an_engine_names_are_checked_at_hello() -> None:
    identity = EngineIdentity("pod", "m", 0, (("full_attention", None), ("sliding_window", 64), ("mamba", None)))
    assert read_identity(identity.wire()) == identity
    assert "groups" not in EngineIdentity("pod").wire() and read_identity({"engine_id": "pod"}).groups == ()
    for bad in ([["Full", None]], [["mamba"]], [["mamba", 0]], [["mamba", "64"]], "mamba"):
        with pytest.raises(BadRequestError):
            read_identity({"engine_id": "pod", "groups": bad})
    with pytest.raises(LimitError):
        read_identity({"engine_id": "pod", "groups": [["mamba", None]] * 17})
