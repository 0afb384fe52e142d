"""The disk header keeps a chunk's engine block names (format version 2) and still reads version 1 files."""

from __future__ import annotations

import pytest

from kvstore.errors import FormatError
from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.tiers.disk.format import (
    ENGINE_FORMAT_VERSION, FORMAT_VERSION, HEADER_BYTES, ChunkHeader, pack_header, unpack_header,
)

KEY, PARENT = bytes(range(16)), bytes(range(16, 32))
NAMES = EngineBlocks(16, (1, 2**64 - 1), 7, tuple(range(32)))


def version_of(block: bytes) -> int:
    return int.from_bytes(block[8:10], "little")


def test_engine_names_round_trip_in_a_version_2_header():
    header = ChunkHeader(KEY, "ns", 4096, 4096, 99, 0, PARENT, NAMES)
    block = pack_header(header)
    assert version_of(block) == ENGINE_FORMAT_VERSION
    assert unpack_header(block) == header


def test_a_header_without_names_stays_version_1_and_reads_back():
    header = ChunkHeader(KEY, "ns", 4096, 4096, 99, 0, PARENT)
    block = pack_header(header)
    assert version_of(block) == FORMAT_VERSION
    assert unpack_header(block) == header


def test_names_too_large_for_the_header_are_left_out():
    big = EngineBlocks(1024, (5,), None, tuple(range(1024)))   # 4 KiB of token ids: no room
    block = pack_header(ChunkHeader(KEY, "ns", 4096, 4096, 99, 0, None, big))
    assert version_of(block) == FORMAT_VERSION and unpack_header(block).engine is None


def test_damaged_names_fail_the_header_sum():
    block = bytearray(pack_header(ChunkHeader(KEY, "ns", 4096, 4096, 99, 0, None, NAMES)))
    block[64 + 2 + 24] ^= 1   # a hash byte
    with pytest.raises(FormatError, match="checksum"):
        unpack_header(bytes(block))
    assert len(block) == HEADER_BYTES
