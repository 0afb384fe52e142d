"""What the daemon writes down of a chunk keeps its namespace's key parameters (disk header version 3, kept arena
descriptions and the journal version 3) and the key as its client sent it, beside the namespace; older records
still read (without parameters), and records name the key bound to the namespace once read."""

from __future__ import annotations

import pytest

from kvstore.binding import rebind
from kvstore.errors import FormatError
from kvstore.protocol.engine_blocks import EngineBlocks
from kvstore.protocol.key_params import KeyParams
from kvstore.tiers.disk.format import (
    ENGINE_FORMAT_VERSION, FORMAT_VERSION, PARAMS_FORMAT_VERSION, ChunkHeader, pack_header, unpack_header,
)
from kvstore.tiers.host.description import KeptChunk, pack_chunk, unpack_chunk

KEY, PARENT = bytes(range(16)), bytes(range(16, 32))
PARAMS = KeyParams(16, "xxh3-128/int64le/v1", 7)
NAMES = EngineBlocks(16, (1, 2), 7, tuple(range(32)))


def version_of(block: bytes) -> int:
    return int.from_bytes(block[8:10], "little")


@pytest.mark.parametrize("engine", [None, NAMES])
def test_a_header_with_params_is_version_3_and_reads_back(engine):
    header = ChunkHeader(KEY, "ns", 4096, 4096, 99, 0, PARENT, engine, params=PARAMS)
    block = pack_header(header)
    assert version_of(block) == PARAMS_FORMAT_VERSION
    assert unpack_header(block) == header


def test_the_header_holds_the_key_as_sent_and_reads_as_bound():
    block = pack_header(ChunkHeader(KEY, "ns", 4096, 4096, 99, 0, PARENT, params=PARAMS))
    assert block[16:32] == rebind("ns", KEY)               # on file: the key as its client sent it
    assert unpack_header(block).key == KEY                 # read: the key the daemon keeps


def test_older_headers_read_without_params():
    for engine, version in ((None, FORMAT_VERSION), (NAMES, ENGINE_FORMAT_VERSION)):
        block = pack_header(ChunkHeader(KEY, "ns", 4096, 4096, 99, 0, None, engine))
        assert version_of(block) == version and unpack_header(block).params is None


def test_damaged_params_fail_the_header_sum():
    block = bytearray(pack_header(ChunkHeader(KEY, "ns", 4096, 4096, 99, 0, None, params=PARAMS)))
    block[64 + 2] ^= 1   # chunk_tokens
    with pytest.raises(FormatError, match="checksum"):
        unpack_header(bytes(block))


def test_params_flag_in_an_older_version_is_refused():
    block = bytearray(pack_header(ChunkHeader(KEY, "ns", 4096, 4096, 99, 0, None, params=PARAMS)))
    block[8:10] = ENGINE_FORMAT_VERSION.to_bytes(2, "little")
    with pytest.raises(FormatError, match="key parameters"):
        unpack_header(bytes(block))


def test_kept_records_carry_params_and_the_key_as_sent():
    chunk = KeptChunk(KEY, 4096, 100, "ns", PARENT, 5, params=PARAMS)
    item = pack_chunk(chunk)
    assert item[0] == rebind("ns", KEY) and item[4] == rebind("ns", PARENT) and item[9] == [16, PARAMS.key_scheme, 7]
    assert unpack_chunk(item) == chunk


@pytest.mark.parametrize("length", [8, 9])
def test_older_kept_records_read_without_params(length):
    item = pack_chunk(KeptChunk(KEY, 4096, 100, "ns", None, 5))[:length]
    assert unpack_chunk(item).params is None and unpack_chunk(item).key == KEY


def test_malformed_params_are_left_unknown_never_guessed():
    item = pack_chunk(KeptChunk(KEY, 4096, 100, "ns", None, 5, params=PARAMS))
    item[9] = [0, "x", -1]
    assert unpack_chunk(item).params is None
