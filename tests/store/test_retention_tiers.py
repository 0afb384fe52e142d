"""Retention classes below DRAM and across a restart: the disk and GPU tiers' queues are split by class as DRAM's
are (a pin there is ``high``), a chunk's class is kept in its disk file's header and in the kept arena's record
and journal (a pin comes back as ``high``), and files and records from before the class read as ``normal``."""

from __future__ import annotations

import os
import struct

import msgpack
import pytest
import xxhash

from kvstore.errors import FormatError
from kvstore.protocol.retention import Retention, parse_retention
from kvstore.sim.movers import InstantDiskMover
from kvstore.store.entry import DiskState
from kvstore.store.retention import RetentionQueue
from kvstore.store.kept import kept_chunk
from kvstore.store.store import PinSettings, Store
from kvstore.tiers.disk.format import FORMAT_VERSION, ChunkHeader, pack_header, unpack_header
from kvstore.tiers.host import description as description_mod
from kvstore.tiers.host import journal as journal_mod
from kvstore.tiers.host.description import ArenaDescription, KeptChunk, read_description, write_description
from kvstore.tiers.host.journal import SlotJournal, read_journal
from kvstore.tiers.host.tier import HostTier
from kvstore.store.ledgers.builder import tier_ledgers
from kvstore.tiers.virtual import VirtualArena, VirtualDisk

CHUNK = 16384
KEY = bytes(range(16))


def disk_store(disk_chunks: int = 12, host_chunks: int = 40, gpu_chunks: int = 0) -> Store:
    """A Store whose disk tier writes every commit at once; pins may take all of DRAM."""
    disk = VirtualDisk(disk_chunks * VirtualDisk(1).footprint(CHUNK))
    gpu = HostTier(VirtualArena(gpu_chunks * CHUNK)) if gpu_chunks else None
    store = Store(HostTier(VirtualArena(host_chunks * CHUNK)), 1e9, 1e9, tier_ledgers("chain-lru", disk, gpu),
                  clock=lambda: 0.0, pins=PinSettings(default_ttl=60.0, max_ttl=60.0, max_share=1.0))
    assert store.disk_ledger is not None
    InstantDiskMover(store.disk_ledger)
    return store


def put(store: Store, name: str, count: int, retention: str = "normal") -> list[bytes]:
    keys = [f"{name}{i}".encode().ljust(16, b".") for i in range(count)]
    handle, _ = store.reserve(b"w", "ns", keys, [CHUNK] * count, None, retention=parse_retention(retention))
    store.commit(b"w", handle.id)
    return keys


def on_disk(store: Store, keys: list[bytes]) -> list[bool]:
    return [k in store.index and store.index[k].disk is DiskState.STORED for k in keys]


# -- eviction order on disk and in the GPU tier -------------------------------------------------------------------
def test_the_disk_evicts_low_before_normal_before_high():
    store = disk_store()
    high = put(store, "h", 4, "high")
    normal = put(store, "n", 4)
    low = put(store, "l", 4, "low")
    put(store, "x", 4)   # the 12-file disk makes room for 4: the low files go, though the high ones are older
    assert not any(on_disk(store, low)) and all(on_disk(store, high + normal))
    put(store, "y", 6)   # 6 more: the normal ones (4 of them, and 2 of x's), never a high one
    assert all(on_disk(store, high)) and not any(on_disk(store, normal))
    assert all(k in store.index for k in low + normal)   # only their disk copies went: DRAM still holds them


def test_a_pin_on_disk_is_high_there():
    store = disk_store()
    pinned = put(store, "p", 12, "pin")
    assert all(on_disk(store, pinned)) and store.retention.soft_pins.chunks == 12
    high = put(store, "h", 2, "high")   # only pins are on disk: they are high there, so two of them make room
    assert all(on_disk(store, high)) and on_disk(store, pinned).count(False) == 2
    assert store.tier_counters.disk_write_skipped == 0
    assert store.retention.soft_pins.chunks == 12   # still pinned in DRAM


def test_every_tiers_queue_is_split_by_class_once_one_is_used():
    store = disk_store(gpu_chunks=4)
    assert store.gpu_ledger is not None and store.disk_ledger is not None
    put(store, "n", 2)
    assert not isinstance(store.disk_ledger.lru, RetentionQueue)   # classes cost nothing until one is used
    put(store, "l", 1, "low")
    for queue in (store.lru, store.disk_ledger.lru, store.gpu_ledger.lru):
        assert isinstance(queue, RetentionQueue)
    assert store.lru.pins and not store.disk_ledger.lru.pins and not store.gpu_ledger.lru.pins


def test_the_gpu_tier_demotes_low_before_normal_before_high():
    store = disk_store(gpu_chunks=6)
    gpu = store.gpu_ledger
    assert gpu is not None
    chunks = {cls: put(store, cls[0], 2, cls) for cls in ("high", "normal", "low")}   # high the oldest
    for keys in chunks.values():
        for key in keys:
            entry = store.index[key]
            assert gpu.start_promote(entry) is not None and gpu.finish_promote(entry, True)
    order = []
    while (victim := gpu.victim()) is not None:
        order.append(victim.retention)
        gpu.lru.remove(victim)
    assert order == [Retention.LOW] * 2 + [Retention.NORMAL] * 2 + [Retention.HIGH] * 2


def test_a_chunk_raised_to_a_higher_class_moves_in_the_disk_queue_too():
    store = disk_store()
    first = put(store, "a", 6, "low")
    put(store, "a", 6, "high")   # stored again as high: raised in every tier
    assert all(store.index[k].retention is Retention.HIGH for k in first)
    put(store, "x", 12)   # would take the low files first: they are high now
    assert all(on_disk(store, first))


# -- the disk header -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [Retention.LOW, Retention.NORMAL, Retention.HIGH])
def test_the_disk_header_keeps_the_class(cls):
    header = ChunkHeader(KEY, "ns", 4096, 4096, 99, 0, None, None, cls)
    block = pack_header(header)
    assert unpack_header(block) == header and int.from_bytes(block[8:10], "little") == FORMAT_VERSION


def test_a_pin_is_written_as_high_and_a_file_from_before_the_class_reads_as_normal():
    assert unpack_header(pack_header(ChunkHeader(KEY, "ns", 4096, 4096, 99, 0, None, None,
                                                 Retention.PIN))).retention is Retention.HIGH
    old = pack_header(ChunkHeader(KEY, "ns", 4096, 4096, 99))   # the field is 0, as every older file has it
    assert old[14:16] == b"\0\0" and unpack_header(old).retention is Retention.NORMAL


def test_an_unknown_class_in_a_header_is_refused():
    block = bytearray(pack_header(ChunkHeader(KEY, "ns", 4096, 4096, 99)))
    block[14] = 7
    block[56:64] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(block[0:56]) + b"ns"))
    with pytest.raises(FormatError, match="unknown retention class 7"):
        unpack_header(bytes(block))


def test_the_disk_index_rebuilt_at_start_gets_each_files_class():
    store = disk_store(disk_chunks=4)
    ledger = store.disk_ledger
    assert ledger is not None
    footprint = VirtualDisk(1).footprint(CHUNK)
    for i, cls in enumerate([Retention.HIGH, Retention.LOW, Retention.NORMAL, Retention.NORMAL]):
        assert ledger.adopt(bytes([i]) * 16, CHUNK, "ns", footprint, retention=cls)
    assert store.retention.split and store.index[bytes([0]) * 16].retention is Retention.HIGH
    assert ledger.lru.pop_oldest() is store.index[bytes([1]) * 16]   # the low one is the disk's first victim


# -- the kept arena's record and journal ---------------------------------------------------------------------------
def test_a_kept_record_keeps_the_class_and_a_pin_as_high():
    store = disk_store()
    put(store, "p", 1, "pin")
    put(store, "l", 1, "low")
    records = [kept_chunk(e, 1) for e in store.index.values()]
    assert sorted(r.retention for r in records) == [Retention.LOW, Retention.HIGH]


def test_a_description_keeps_classes_and_reads_a_version_1_one_as_normal(tmp_path):
    chunks = [KeptChunk(bytes([i]) * 16, i * 4096, 4096, "ns", None, 7, False, None, cls)
              for i, cls in enumerate([Retention.LOW, Retention.NORMAL, Retention.HIGH])]
    path = str(tmp_path / "a.kept")
    write_description(path, ArenaDescription("/s", os.getuid(), 1 << 20, chunks))
    back = read_description(path)
    assert back is not None and back.chunks == chunks
    payload = msgpack.packb({"socket": "/s", "uid": 0, "arena_size": 1 << 20, "written": 0.0,
                             "chunks": [description_mod.pack_chunk(c)[:8] for c in chunks]}, use_bin_type=True)
    with open(path, "wb") as f:   # a version 1 description: records of 8 fields
        f.write(struct.pack("<8sIIQQ", description_mod.MAGIC, 1, 0, len(payload), xxhash.xxh3_64_intdigest(payload)))
        f.write(payload)
    old = read_description(path)
    assert old is not None and [c.retention for c in old.chunks] == [Retention.NORMAL] * 3


def test_the_journal_keeps_classes_and_reads_a_version_1_one_as_normal(tmp_path):
    j = SlotJournal.create(str(tmp_path / "j"), "/s")
    j.committed([KeptChunk(KEY, 0, 4096, "ns", None, 7, retention=Retention.LOW)])
    replay = read_journal(j.path)
    assert replay is not None and replay.chunks[0].retention is Retention.LOW
    body = msgpack.packb(description_mod.pack_chunk(KeptChunk(KEY, 0, 4096, "ns", None, 7))[:8], use_bin_type=True)
    with open(j.path, "wb") as f:   # a version 1 journal: COMMITs of 8 fields
        f.write(struct.pack("<8sII", journal_mod.MAGIC, 1, 2) + b"/s")
        f.write(struct.pack("<B3xIQ", journal_mod.COMMIT, len(body), xxhash.xxh3_64_intdigest(body)) + body)
    old = read_journal(j.path)
    assert old is not None and old.chunks[0].retention is Retention.NORMAL and old.chunks[0].key == KEY


def test_adopted_host_copies_get_their_class_back():
    store = disk_store()
    arena = store.host
    offsets = arena.adopt([(0, CHUNK), (CHUNK, CHUNK)])
    chunks = [KeptChunk(bytes([i]) * 16, off, CHUNK, "ns", None, 7, retention=cls)
              for i, (off, cls) in enumerate(zip(sorted(offsets), [Retention.HIGH, Retention.LOW]))]
    published, _ = store.kept.adopt(chunks)
    assert [e.retention for e in published] == [Retention.HIGH, Retention.LOW] and store.retention.split
    assert store.lru.pop_oldest() is published[1]   # the low one goes first
