"""SGLang connector: loaded by SGLang's own backend factory, driven like its cache controller, real daemon."""

from __future__ import annotations

import pytest
import torch
from harness.servers import require_module

require_module("sglang", "SGLang's HiCache storage interface (the sglang wheel)")

from support.engines.sglang_env import HostPool, host_indices, slots_of, storage_config  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageExtraInfo  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402

LAYERS, HEADS, DIM, PAGE = 3, 2, 8, 16
LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]


def backend(address: str, pool: HostPool, tp_rank: int = 0, tp_size: int = 1, **extra):
    config = storage_config({"backend_name": "kvstore", "module_path": "kvstore.connectors.sglang",
                             "class_name": "KVStoreHiCacheStorage", "interface_v1": 1, "address": address,
                             "timeout": 0.5, **extra}, tp_rank, tp_size, pool.layout.startswith("page_first"))
    b = StorageBackendFactory.create_backend("dynamic", config, pool)
    b.register_mem_pool_host(pool)
    assert isinstance(b, HiCacheStorage)
    return b


def kv(tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(1, HEADS, tokens, DIM, generator=g) for _ in range(LAYERS)],
            [torch.randn(1, HEADS, tokens, DIM, generator=g) for _ in range(LAYERS)])


@pytest.mark.parametrize("src_layout,dst_layout", list(zip(LAYOUTS, LAYOUTS[1:] + LAYOUTS[:1])))
def test_zero_copy_pages_round_trip_across_layouts(daemon, src_layout, dst_layout):
    tokens = list(range(100, 100 + 4 * PAGE))
    hashes = get_hash_str(tokens, None, page_size=PAGE)
    keys, values = kv(len(tokens), seed=1)

    src = HostPool(src_layout, LAYERS, HEADS, DIM, PAGE, pages=8)
    src.write_tokens(keys, values, slots_of([5, 1, 6, 2]))
    writer = backend(daemon.address, src)
    assert writer.batch_exists(hashes) == 0
    assert writer.batch_set_v1(hashes[:2], host_indices([5, 1])) == [True, True]
    info = HiCacheStorageExtraInfo(prefix_keys=hashes[:2])
    assert writer.batch_set_v1(hashes[2:], host_indices([6, 2]), info) == [True, True]

    dst = HostPool(dst_layout, LAYERS, HEADS, DIM, PAGE, pages=8)
    reader = backend(daemon.address, dst)
    assert reader.batch_exists(hashes + get_hash_str(list(range(PAGE)), hashes[-1], page_size=PAGE)) == 4
    assert reader.batch_get_v1(hashes, host_indices([0, 7, 3, 4])) == [True] * 4
    got_k, got_v = dst.read_tokens(slots_of([0, 7, 3, 4]))
    for layer in range(LAYERS):
        assert torch.equal(got_k[layer], keys[layer]) and torch.equal(got_v[layer], values[layer])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generic_flat_pages_as_the_cache_controller_moves_them(daemon, layout):
    tokens = list(range(7, 7 + 3 * PAGE))
    hashes = get_hash_str(tokens, None, page_size=PAGE)
    keys, values = kv(len(tokens), seed=2)
    src = HostPool(layout, LAYERS, HEADS, DIM, PAGE, pages=4)
    src.write_tokens(keys, values, slots_of([3, 0, 2]))
    b = backend(daemon.address, src)
    # the controller's generic backup: one flat page per hash from get_data_page
    assert b.batch_set(hashes, [src.get_data_page(p * PAGE) for p in (3, 0, 2)]) is True
    assert b.exists(hashes[1]) and b.batch_exists(hashes) == 3

    dst = HostPool(layout, LAYERS, HEADS, DIM, PAGE, pages=4)
    # the controller's generic prefetch: dummy flat pages filled by batch_get, then set_from_flat_data_page
    pages = b.batch_get(hashes, [dst.get_dummy_flat_data_page() for _ in hashes])
    assert all(p is not None for p in pages)
    for page, index in zip(pages, (1, 2, 0)):
        dst.set_from_flat_data_page(index * PAGE, page)
    got_k, got_v = dst.read_tokens(slots_of([1, 2, 0]))
    for layer in range(LAYERS):
        assert torch.equal(got_k[layer], keys[layer]) and torch.equal(got_v[layer], values[layer])
    assert b.get("0" * 64) is None


def test_leading_hits_stop_at_first_missing_page(daemon):
    pool = HostPool("layer_first", LAYERS, HEADS, DIM, PAGE, pages=4)
    b = backend(daemon.address, pool)
    hashes = get_hash_str(list(range(4 * PAGE)), None, page_size=PAGE)
    assert b.batch_set_v1([hashes[0], hashes[2]], host_indices([0, 1])) == [True, True]
    assert b.batch_exists(hashes) == 1
    assert b.batch_get_v1(hashes, host_indices([0, 1, 2, 3])) == [True, False, False, False]


def test_other_shard_or_model_never_hits(daemon):
    pool = HostPool("page_first", LAYERS, HEADS, DIM, PAGE, pages=2)
    hashes = get_hash_str(list(range(2 * PAGE)), None, page_size=PAGE)
    assert backend(daemon.address, pool, tp_rank=0, tp_size=2).batch_set_v1(hashes, host_indices([0, 1])) == [True] * 2
    assert backend(daemon.address, pool, tp_rank=0, tp_size=2).batch_exists(hashes) == 2
    assert backend(daemon.address, pool, tp_rank=1, tp_size=2).batch_exists(hashes) == 0
    assert backend(daemon.address, pool, tp_rank=0, tp_size=2, model_id="other").batch_exists(hashes) == 0
    bf16 = HostPool("page_first", LAYERS, HEADS, DIM, PAGE, pages=2, dtype=torch.bfloat16)
    assert backend(daemon.address, bf16, tp_rank=0, tp_size=2).batch_exists(hashes) == 0


def test_daemon_down_means_misses_and_dropped_writes(tmp_path):
    pool = HostPool("layer_first", LAYERS, HEADS, DIM, PAGE, pages=2)
    b = backend(f"ipc://{tmp_path}/nobody.sock", pool)
    hashes = get_hash_str(list(range(2 * PAGE)), None, page_size=PAGE)
    assert b.batch_exists(hashes) == 0
    assert b.batch_set_v1(hashes, host_indices([0, 1])) == [False, False]
    assert b.batch_set(hashes, [pool.get_data_page(0), pool.get_data_page(PAGE)]) is False
    assert b.batch_get(hashes, [pool.get_dummy_flat_data_page()] * 2) == [None, None]
    assert b.batch_get_v1(hashes, host_indices([0, 1])) == [False, False]


def test_tensor_parallel_ranks_read_their_heads_whatever_tp_size_wrote_them(daemon):
    """Canonical chunks are stored per rank, each rank its KV heads: a rank of TP=2 reads its head of pages a
    TP=1 engine wrote, and a TP=1 engine reads the pages TP=2's ranks wrote, head by head (SGLang's CPU path
    does not run TP=2: these are the backends its ranks would make, over a real daemon)."""
    one_k, one_v = kv(3 * PAGE, seed=7)
    two_k, two_v = kv(3 * PAGE, seed=8)
    by_one = get_hash_str(list(range(300, 300 + 3 * PAGE)), None, page_size=PAGE)
    by_two = get_hash_str(list(range(400, 400 + 3 * PAGE)), None, page_size=PAGE)

    full = HostPool("layer_first", LAYERS, HEADS, DIM, PAGE, pages=4)
    full.write_tokens(one_k, one_v, slots_of([0, 1, 2]))
    assert backend(daemon.address, full).batch_set_v1(by_one, host_indices([0, 1, 2])) == [True] * 3
    for rank in range(2):
        pool = HostPool("layer_first", LAYERS, 1, DIM, PAGE, pages=4)
        pool.write_tokens([k[:, rank:rank + 1] for k in two_k], [v[:, rank:rank + 1] for v in two_v],
                          slots_of([0, 1, 2]))
        ranked = backend(daemon.address, pool, tp_rank=rank, tp_size=2)
        assert ranked.batch_set_v1(by_two, host_indices([0, 1, 2])) == [True] * 3   # its head only
        assert ranked.batch_exists(by_one) == 3
        assert ranked.batch_get_v1(by_one, host_indices([3, 2, 1])) == [True] * 3
        got_k, got_v = pool.read_tokens(slots_of([3, 2, 1]))
        for layer in range(LAYERS):
            assert torch.equal(got_k[layer], one_k[layer][:, rank:rank + 1])
            assert torch.equal(got_v[layer], one_v[layer][:, rank:rank + 1])

    reader = HostPool("layer_first", LAYERS, HEADS, DIM, PAGE, pages=4)
    whole = backend(daemon.address, reader)
    assert whole.batch_exists(by_two) == 3           # both heads, from the two ranks' slices
    assert whole.batch_get_v1(by_two, host_indices([2, 0, 3])) == [True] * 3
    got_k, got_v = reader.read_tokens(slots_of([2, 0, 3]))
    for layer in range(LAYERS):
        assert torch.equal(got_k[layer], two_k[layer]) and torch.equal(got_v[layer], two_v[layer])
