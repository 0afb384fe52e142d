"""Round trips between engine KV layouts and the chunk layout."""

from __future__ import annotations

import pytest
import torch

from kvstore.connectors.common import layout
from kvstore.connectors.common.layout import KVGeometry

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


def test_paged_namespace_names_the_cache_format():
    g = layout.PagedGeometry(num_layers=4, layer_block_bytes=1024, blocks_per_chunk=2, chunk_tokens=256,
                             cache_format="full(kv_heads=2,head=32,float32,block=128);LBHNC;cpu")
    assert g.chunk_nbytes == 4 * 2 * 1024
    base = layout.paged_namespace("m", g)
    other = layout.PagedGeometry(4, 1024, 2, 256, "full(kv_heads=2,head=32,float32,block=128);LBNHC;cuda")
    assert len({base, layout.paged_namespace("m", other), layout.paged_namespace("m", g, salt="s"),
                layout.paged_namespace("m", g, tp_rank=1, tp_size=2), layout.namespace("m", GEOM)}) == 5
    with pytest.raises(ValueError, match="positive"):
        layout.PagedGeometry(0, 1024, 2, 256, "x")


def test_a_connector_says_hello_in_its_models_namespace_and_a_long_name_stays_distinct():
    from kvstore.connectors.common.layout import session_namespace
    from kvstore.protocol.hello import MAX_NAMESPACE_CHARS

    assert session_namespace("vllm:org/model") == "vllm:org/model"
    assert session_namespace("vllm:org/model", "tenant-a") == "vllm:org/model;salt=tenant-a"
    long_a, long_b = "vllm:" + "a" * 600, "vllm:" + "a" * 599 + "b"
    a, b = session_namespace(long_a), session_namespace(long_b)
    assert len(a) == len(b) == MAX_NAMESPACE_CHARS and a != b
