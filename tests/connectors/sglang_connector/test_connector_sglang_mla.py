"""SGLang connector with MLA host pools: SGLang's own backend factory, a real daemon, bytes exact."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

pytest.importorskip("sglang")

from support.engines.sglang_env import HostPool, MLAHostPool, host_indices, slots_of, storage_config
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageExtraInfo
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str

LAYERS, RANK, ROPE, PAGE = 3, 512, 64, 16  # DeepSeek's latent and rope widths
LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


def backend(address: str, pool, tp_rank: int = 0, tp_size: int = 1, mla: bool = True, pp_rank: int = 0,
            pp_size: int = 1, **extra):
    config = storage_config({"backend_name": "kvstore", "module_path": "kvstore.connectors.sglang",
                             "class_name": "KVStoreHiCacheStorage", "interface_v1": 1, "address": address,
                             "timeout": 0.5, **extra}, tp_rank, tp_size, pool.layout.startswith("page_first"),
                            mla=mla, pp_rank=pp_rank, pp_size=pp_size)
    b = StorageBackendFactory.create_backend("dynamic", config, pool)
    b.register_mem_pool_host(pool)
    assert isinstance(b, HiCacheStorage)
    return b


def pool(layout: str, pages: int = 8, dtype: torch.dtype = torch.float32) -> MLAHostPool:
    return MLAHostPool(layout, LAYERS, RANK, ROPE, PAGE, pages, dtype)


def rows(tokens: int, seed: int) -> torch.Tensor:
    return torch.randn(LAYERS, tokens, RANK + ROPE, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("src_layout,dst_layout", list(zip(LAYOUTS, LAYOUTS[1:] + LAYOUTS[:1])))
def test_latent_pages_round_trip_across_layouts_and_ranks(daemon, src_layout, dst_layout):
    hashes = get_hash_str(list(range(50, 50 + 4 * PAGE)), None, page_size=PAGE)
    data = rows(4 * PAGE, seed=1)
    src = pool(src_layout)
    src.write_rows(data, slots_of([5, 1, 6, 2]))
    writer = backend(daemon.address, src, tp_rank=0, tp_size=2)  # SGLang's one MLA writer
    assert writer.batch_set_v1(hashes[:2], host_indices([5, 1])) == [True, True]
    info = HiCacheStorageExtraInfo(prefix_keys=hashes[:2])
    assert writer.batch_set_v1(hashes[2:], host_indices([6, 2]), info) == [True, True]

    # Every rank of every TP size reads the one copy rank 0 wrote.
    for tp_rank, tp_size in ((1, 2), (3, 4), (0, 1)):
        dst = pool(dst_layout)
        reader = backend(daemon.address, dst, tp_rank=tp_rank, tp_size=tp_size)
        assert reader.batch_exists(hashes) == 4
        assert reader.batch_get_v1(hashes, host_indices([0, 7, 3, 4])) == [True] * 4
        assert torch.equal(dst.read_rows(slots_of([0, 7, 3, 4])), data)
    with daemon.client(namespace="kvstore-cli", use_arena=False) as c:
        assert c.stats()["tiers"]["host"]["chunks"] == 4  # stored once, not once per rank


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generic_flat_latent_pages(daemon, layout):
    hashes = get_hash_str(list(range(9, 9 + 3 * PAGE)), None, page_size=PAGE)
    data = rows(3 * PAGE, seed=2).to(torch.bfloat16)
    src = pool(layout, pages=4, dtype=torch.bfloat16)
    src.write_rows(data, slots_of([3, 0, 2]))
    b = backend(daemon.address, src)
    assert b.batch_set(hashes, [src.get_data_page(p * PAGE) for p in (3, 0, 2)]) is True
    dst = pool(layout, pages=4, dtype=torch.bfloat16)
    pages = b.batch_get(hashes, [dst.get_dummy_flat_data_page() for _ in hashes])
    for page, index in zip(pages, (1, 2, 0)):
        dst.set_from_flat_data_page(index * PAGE, page)
    got = dst.read_rows(slots_of([1, 2, 0]))
    assert torch.equal(got.view(torch.int16), data.view(torch.int16))


def test_mla_pages_never_meet_mha_dtype_width_or_other_stage(daemon):
    hashes = get_hash_str(list(range(2 * PAGE)), None, page_size=PAGE)
    src = pool("layer_first", pages=2)
    src.write_rows(rows(2 * PAGE, seed=3), slots_of([0, 1]))
    assert backend(daemon.address, src).batch_set_v1(hashes, host_indices([0, 1])) == [True, True]
    assert backend(daemon.address, pool("page_first")).batch_exists(hashes) == 2
    assert backend(daemon.address, pool("layer_first", dtype=torch.bfloat16)).batch_exists(hashes) == 0
    narrow = MLAHostPool("layer_first", LAYERS, 256, ROPE, PAGE, 2)
    assert backend(daemon.address, narrow).batch_exists(hashes) == 0
    assert backend(daemon.address, pool("layer_first"), pp_rank=1, pp_size=2).batch_exists(hashes) == 0
    mha = HostPool("layer_first", LAYERS, 1, RANK + ROPE, PAGE, pages=2)
    assert backend(daemon.address, mha, mla=False).batch_exists(hashes) == 0


def test_unknown_pool_is_off_with_one_line(daemon, caplog):
    class HybridPool:  # what a Mamba/SWA pool looks like to a backend: no per-head KV
        layout, layer_num, page_size, dtype = "layer_first", 2, PAGE, torch.float32

    hashes = get_hash_str(list(range(PAGE)), None, page_size=PAGE)
    with caplog.at_level(logging.WARNING, logger="kvstore.connectors.sglang"):
        b = backend(daemon.address, HybridPool(), mla=False)
    assert b.batch_exists(hashes) == 0 and b.batch_set_v1(hashes, host_indices([0])) == [False]
    assert [r.getMessage() for r in caplog.records] == [
        "kvstore sglang connector off (HybridPool): K and V of unequal head dims, or no per-head KV "
        "(hybrid or state pools)"]


def test_context_parallel_slices_do_not_share_chunks_and_dcp_is_off(daemon, caplog):
    hashes = get_hash_str(list(range(PAGE)), None, page_size=PAGE)
    src = pool("layer_first", pages=1)
    src.write_rows(rows(PAGE, seed=4), slots_of([0]))
    cp0 = backend(daemon.address, src)
    cp0.config = dataclasses.replace(cp0.config, attn_cp_rank=0, attn_cp_size=2)
    cp0.register_mem_pool_host(src)
    assert cp0.batch_set_v1(hashes, host_indices([0])) == [True]
    cp1 = backend(daemon.address, pool("layer_first", pages=1))
    cp1.config = dataclasses.replace(cp1.config, attn_cp_rank=1, attn_cp_size=2)
    cp1.register_mem_pool_host(pool("layer_first", pages=1))
    assert cp1.batch_exists(hashes) == 0   # another slice of the page: never the first rank's bytes
    assert backend(daemon.address, pool("layer_first", pages=1), tp_rank=1, tp_size=2).batch_exists(hashes) == 0

    dcp = backend(daemon.address, pool("layer_first", pages=1))
    dcp.config = dataclasses.replace(dcp.config, tp_size=2, dcp_size=2, logical_page_size=2 * PAGE)
    with caplog.at_level(logging.WARNING, logger="kvstore.connectors.sglang"):
        dcp.register_mem_pool_host(pool("layer_first", pages=1))
    assert dcp.batch_exists(hashes) == 0
    assert "kvstore sglang connector off (mla): decode context parallelism" in caplog.text
