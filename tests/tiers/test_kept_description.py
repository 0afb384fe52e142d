"""The kept arena's description and the allocator's adoption of its slots (no processes)."""

from __future__ import annotations

import os

import pytest

from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.tiers.allocator import ExtentAllocator
from kvstore.tiers.host.description import (ArenaDescription, DescriptionError, KeptChunk, read_description,
                                            write_description)


def test_adopted_extents_are_allocated_and_the_gaps_free():
    alloc = ExtentAllocator(1 << 20)
    taken = alloc.adopt([(8192, 4096), (0, 4096), (4096 * 10, 8192), (4096 * 11, 4096), (1 << 20, 4096), (3, 8)])
    assert sorted(taken) == [0, 8192, 4096 * 10]   # an overlap, one past the end and a misaligned one left out
    assert alloc.used_bytes == 4 * 4096
    got = {alloc.allocate(4096) for _ in range(256 - 4)}
    assert None not in got and got.isdisjoint(taken) and alloc.allocate(4096) is None
    alloc.free(8192)
    assert alloc.allocate(4096) == 8192


def test_adopt_refuses_an_allocator_in_use():
    alloc = ExtentAllocator(1 << 20)
    alloc.allocate(4096)
    with pytest.raises(ValueError):
        alloc.adopt([(8192, 4096)])


def chunk(i: int, engine: EngineBlocks | None = None) -> KeptChunk:
    return KeptChunk(os.urandom(16), i * 4096, 4096, "ns", None if i == 0 else b"p" * 16, 2 ** 63 + i, i % 2 == 1,
                     engine)


def test_a_description_reads_back_as_written(tmp_path):
    blocks = EngineBlocks(2, (1, 2 ** 64 - 1), None, (5, 6, 7, 8))
    desc = ArenaDescription("/run/kv.sock", os.getuid(), 1 << 20, [chunk(0, blocks), chunk(1), chunk(2)])
    path = str(tmp_path / "a.kept")
    write_description(path, desc)
    back = read_description(path)
    assert back is not None and back.chunks == desc.chunks and back.socket == desc.socket
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("at, needle", [(0, "not a kept-arena description"), (40, "damaged")])
def test_a_damaged_description_is_refused_in_one_line(tmp_path, at, needle):
    path = str(tmp_path / "a.kept")
    write_description(path, ArenaDescription("/s", 0, 1 << 20, [chunk(0), chunk(1)]))
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DescriptionError, match=needle) as info:
        read_description(path)
    assert "\n" not in str(info.value)


def test_no_description_is_none(tmp_path):
    assert read_description(str(tmp_path / "missing")) is None
