"""Round trips between engine KV layouts and the chunk layout."""

from __future__ import annotations

import pytest
import torch

from kvstore.connectors import layout
from kvstore.connectors.layout import KVGeometry

GEOM = KVGeometry(num_layers=3, num_kv_heads=2, head_dim=4, dtype=torch.float32, chunk_tokens=8)


def _dense(seq: int, geometry: KVGeometry = GEOM):
    shape = (1, geometry.num_kv_heads, seq, geometry.head_dim)
    keys = [torch.randn(shape).to(geometry.dtype) for _ in range(geometry.num_layers)]
    values = [torch.randn(shape).to(geometry.dtype) for _ in range(geometry.num_layers)]
    return keys, values


def test_chunk_shape_and_size():
    assert GEOM.chunk_shape == (3, 2, 8, 2, 4)
    assert GEOM.chunk_nbytes == 3 * 2 * 8 * 2 * 4 * 4
    bf16 = KVGeometry(32, 8, 128, torch.bfloat16, 256)
    assert bf16.chunk_nbytes == 32 * 1024 * 1024  # Llama-3-8B: 32 MiB a chunk


def test_dense_round_trip_and_token_order():
    keys, values = _dense(3 * GEOM.chunk_tokens + 5)
    chunks = layout.dense_to_chunks(keys, values, 1, 2, GEOM)
    assert chunks.shape == (2, *GEOM.chunk_shape)
    # chunk 0 of the result is tokens 8..15; token 3 of it is token 11
    torch.testing.assert_close(chunks[0, 2, 0, 3], keys[2][0, :, 11, :])
    torch.testing.assert_close(chunks[1, 1, 1, 7], values[1][0, :, 23, :])
    k2, v2 = layout.chunks_to_dense(chunks)
    for layer in range(GEOM.num_layers):
        torch.testing.assert_close(k2[layer], keys[layer][:, :, 8:24])
        torch.testing.assert_close(v2[layer], values[layer][:, :, 8:24])


def test_bytes_round_trip():
    geometry = KVGeometry(2, 2, 4, torch.bfloat16, 8)
    keys, values = _dense(16, geometry)
    chunks = layout.dense_to_chunks(keys, values, 0, 2, geometry)
    buffers = [memoryview(c.contiguous().view(torch.uint8).numpy().tobytes()) for c in chunks]
    assert all(len(b) == geometry.chunk_nbytes for b in buffers)
    back = layout.chunks_from_buffers(buffers, geometry)
    assert torch.equal(back.view(torch.int16), chunks.view(torch.int16))
    with pytest.raises(ValueError):
        layout.chunk_from_buffer(buffers[0][:-2], geometry)


def test_paged_round_trip_through_scattered_blocks():
    block_size, num_blocks = 4, 20
    caches = [torch.zeros(num_blocks, GEOM.num_kv_heads, block_size, 2 * GEOM.head_dim) for _ in range(3)]
    # a request whose 24 tokens sit in six non-contiguous blocks
    table = torch.tensor([7, 2, 15, 0, 11, 4])
    keys, values = _dense(24)
    chunks = layout.dense_to_chunks(keys, values, 0, 3, GEOM)
    layout.scatter_paged(chunks, caches, table, 0)
    # token 13 lives in block table[3] = 0, offset 1
    torch.testing.assert_close(caches[1][0, :, 1, :4], keys[1][0, :, 13])
    torch.testing.assert_close(caches[1][0, :, 1, 4:], values[1][0, :, 13])
    back = layout.gather_paged(caches, table, 1, 2, GEOM)
    torch.testing.assert_close(back, chunks[1:])


def test_paged_scatter_skips_engine_owned_tokens():
    caches = [torch.zeros(4, 2, 4, 8) for _ in range(3)]
    table = torch.tensor([3, 1, 0, 2])
    keys, values = _dense(16)
    chunks = layout.dense_to_chunks(keys, values, 0, 2, GEOM)
    layout.scatter_paged(chunks, caches, table, 0, skip_tokens=4)
    assert torch.count_nonzero(caches[0][3]) == 0  # first block untouched
    torch.testing.assert_close(caches[0][1, :, 0, :4], keys[0][0, :, 4])


def test_paged_respects_physical_stride_order():
    # vLLM may keep a layer as [blocks, block_size, heads, 2D] in memory and hand
    # out the [blocks, heads, block_size, 2D] view; indexing must not care.
    physical = [torch.zeros(6, 4, 2, 8) for _ in range(3)]
    caches = [p.permute(0, 2, 1, 3) for p in physical]
    table = torch.tensor([5, 0, 3, 1])
    keys, values = _dense(16)
    chunks = layout.dense_to_chunks(keys, values, 0, 2, GEOM)
    layout.scatter_paged(chunks, caches, table, 0)
    torch.testing.assert_close(physical[2][3, 1, :, :4], keys[2][0, :, 9])
    torch.testing.assert_close(layout.gather_paged(caches, table, 0, 2, GEOM), chunks)


@pytest.mark.parametrize(
    "name,shape",
    [
        ("layer_first", (2, 3, 8, 2, 4)),
        ("page_first", (2, 8, 3, 2, 4)),
        ("page_first_direct", (2, 1, 3, 8, 2, 4)),
        ("page_head", (2, 1, 2, 8, 3, 4)),
    ],
)
def test_host_page_layouts(name, shape):
    keys, values = _dense(8)
    chunk = layout.dense_to_chunks(keys, values, 0, 1, GEOM)[0]
    page = torch.zeros(shape)
    layout.chunk_into_page(chunk, page, name)
    assert torch.equal(layout.page_to_chunk(page, name), chunk)
    # spot-check the engine's own axis meaning: K of layer 2, token 5
    expect = keys[2][0, :, 5, :]
    got = {
        "layer_first": lambda: page[0, 2, 5],
        "page_first": lambda: page[0, 5, 2],
        "page_first_direct": lambda: page[0, 0, 2, 5],
        "page_head": lambda: page[0, 0, :, 5, 2],
    }[name]()
    torch.testing.assert_close(got, expect)


def test_namespace_names_everything_that_changes_bytes():
    base = layout.namespace("m", GEOM)
    variants = {
        layout.namespace("m2", GEOM),
        layout.namespace("m", KVGeometry(3, 2, 4, torch.float16, 8)),
        layout.namespace("m", KVGeometry(4, 2, 4, torch.float32, 8)),
        layout.namespace("m", KVGeometry(3, 1, 4, torch.float32, 8)),
        layout.namespace("m", KVGeometry(3, 2, 8, torch.float32, 8)),
        layout.namespace("m", KVGeometry(3, 2, 4, torch.float32, 16)),
        layout.namespace("m", GEOM, tp_rank=1, tp_size=2),
        layout.namespace("m", GEOM, tp_rank=0, tp_size=2),
        layout.namespace("m", GEOM, salt="s"),
    }
    assert base not in variants and len(variants) == 9
    assert f"v{layout.LAYOUT_VERSION}" in base


def test_paged_kernel_blocks_split_engine_blocks():
    # block ids name 8-token blocks; the cache holds them as pairs of 4-token kernel blocks
    caches = [torch.zeros(2 * 5, 2, 4, 8) for _ in range(3)]
    table = torch.tensor([4, 1])
    keys, values = _dense(16)
    chunks = layout.dense_to_chunks(keys, values, 0, 2, GEOM)
    layout.scatter_paged(chunks, caches, table, 0, block_size=8)
    # token 13: block id table[1] = 1, within 5 -> kernel block 1 * 2 + 1 = 3, offset 1
    torch.testing.assert_close(caches[0][3, :, 1, :4], keys[0][0, :, 13])
    torch.testing.assert_close(layout.gather_paged(caches, table, 0, 2, GEOM, block_size=8), chunks)
