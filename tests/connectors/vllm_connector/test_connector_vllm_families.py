"""vLLM model families on the CPU with constructed KV cache configs (vLLM's own spec classes): the layouts
GPU builds report (hybrid groups, fp8, pipeline stages, MLA under tensor parallelism) and the ones refused.

The real engine runs dense, MLA and sliding-window models (`test_vllm_engine.py`, `test_vllm_families.py`);
these check the rest of the logic: what a chunk holds per group, which blocks a load writes and a save takes,
and that every layout difference shows in the namespace.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from harness.servers import require_module

require_module("vllm", "vLLM's interface modules (the vllm wheel, without its engine)")

from harness.engines.vllm_env import layer_names, vllm_config  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    CrossAttentionSpec, FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVQuantMode, MambaSpec,
    MLAAttentionSpec, SlidingWindowSpec,
)

from kvstore.connectors.common.transfers import Transfers  # noqa: E402
from kvstore.connectors.common.families import Unsupported  # noqa: E402
from kvstore.connectors.common.layout import paged_namespace  # noqa: E402
from kvstore.connectors.vllm import KVStoreConnector  # noqa: E402
from kvstore.connectors.vllm.geometry import KEEP, NULL_BLOCK, engine_geometry  # noqa: E402
from kvstore.ops import PagedKV  # noqa: E402

BLOCK, CHUNK = 16, 64


def config(*groups, **kw) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=list(groups), **kw)


def full(**kw):
    return FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.float32, **kw)


def sliding(window: int = 24):
    return SlidingWindowSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.float32, sliding_window=window)


def engine_config(model_type: str = "gemma3", pp: int = 1, layers: int = 4, **cache):
    """The parts of a VllmConfig the geometry reads (a full one needs a model on disk)."""
    return SimpleNamespace(
        model_config=SimpleNamespace(hf_config=SimpleNamespace(model_type=model_type),
                                     hf_text_config=SimpleNamespace(num_hidden_layers=layers)),
        parallel_config=SimpleNamespace(pipeline_parallel_size=pp, tensor_parallel_size=1),
        cache_config=SimpleNamespace(cache_dtype=cache.get("dtype", "auto"),
                                     calculate_kv_scales=cache.get("calculate", False)),
        device_config=SimpleNamespace(device_type="cuda"))


def hybrid():
    """As GPU builds report Gemma 3: a full-attention group and a sliding-window group, each its own table."""
    names = layer_names(4)
    return config(KVCacheGroupSpec([names[3]], full()), KVCacheGroupSpec(names[:3], sliding()))


def ns(cfg, vcfg=None, **kw) -> str:
    g = engine_geometry(cfg, CHUNK, vcfg or engine_config())
    return paged_namespace("m", g.paged, replicated=g.mla, stage=g.stage, **kw)


def test_hybrid_groups_make_one_chunk_of_every_layer_and_name_their_kinds():
    g = engine_geometry(hybrid(), CHUNK, engine_config())
    assert [x.kind for x in g.groups] == ["full", "swa24"] and g.frees_blocks
    assert g.paged.chunk_nbytes == 4 * (CHUNK // BLOCK) * full().page_size_bytes
    dense = config(KVCacheGroupSpec(layer_names(4), full()))
    one_group_window = config(KVCacheGroupSpec(layer_names(4), full(sliding_window=24)))  # no hybrid allocator
    names = {ns(hybrid()), ns(dense), ns(one_group_window), ns(config(KVCacheGroupSpec(layer_names(4)[:3], sliding(32)),
                                                                       KVCacheGroupSpec([layer_names(4)[3]], full())))}
    assert len(names) == 4 and "swa24" in ns(hybrid())


def test_a_save_takes_only_chunks_every_group_still_holds():
    g = engine_geometry(hybrid(), CHUNK, engine_config())
    full_ids, swa_ids = list(range(1, 17)), list(range(17, 33))  # 4 chunks of 4 blocks per group
    assert g.valid_chunks([full_ids, swa_ids], 0, 4, computed_before=0) == 0
    # 200 tokens computed before the step: vLLM freed the sliding blocks wholly behind token 200 - 24 + 1.
    assert g.valid_chunks([full_ids, swa_ids], 0, 4, computed_before=200) == 3
    nulled = [NULL_BLOCK] * 6 + swa_ids[6:]                     # as a table holds them once freed
    assert g.valid_chunks([full_ids, nulled], 0, 4, computed_before=0) == 2
    assert g.valid_chunks([full_ids, swa_ids[:8]], 0, 4, computed_before=0) == 4  # blocks not there: none


def test_a_load_writes_exactly_the_blocks_vllm_allocated():
    g = engine_geometry(hybrid(), CHUNK, engine_config())
    blocks = g.chunk_blocks([[5, 6, 7, 8], [NULL_BLOCK, NULL_BLOCK, 9, 10]], 0, skip_tokens=BLOCK)
    assert blocks == [[KEEP, 6, 7, 8], [KEEP, KEEP, 9, 10]]
    assert g.chunk_blocks([[5, 6, 7, 8], [0, 0, 9, 10]], 0, ratio=2)[0] == [10, 11, 12, 13, 14, 15, 16, 17]
    # The bytes: gather a chunk out of one engine's groups, scatter it into another's where the sliding group
    # holds only the blocks inside its window; the null block and the held block are left as they were.
    torch.manual_seed(0)
    src = [[torch.randn(32, 2, BLOCK, 16) for _ in range(n)] for n in (1, 3)]
    dst = [[torch.zeros(32, 2, BLOCK, 16) for _ in range(n)] for n in (1, 3)]
    a = Transfers([PagedKV.from_blocks(layers, BLOCK) for layers in src], None, None, 1)
    b = Transfers([PagedKV.from_blocks(layers, BLOCK) for layers in dst], None, None, 1)
    try:
        chunk = torch.empty(g.paged.chunk_nbytes, dtype=torch.uint8)
        a._gather([[1, 2, 3, 4], [5, 6, 7, 8]], chunk, None)
        b._scatter(chunk, [[KEEP, 12, 13, 14], [KEEP, KEEP, 17, 18]])
    finally:
        a.close()
        b.close()
    assert torch.equal(dst[0][0][12:15], src[0][0][2:5]) and not dst[0][0][11].any()
    for s, d in zip(src[1], dst[1]):
        assert torch.equal(d[17:19], s[7:9])
        assert not d[NULL_BLOCK].any() and not d[15:17].any()


def test_mla_is_one_plane_stored_once_for_every_tensor_parallel_rank():
    mla = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    cfg = config(KVCacheGroupSpec(layer_names(3), mla))
    g = engine_geometry(cfg, CHUNK, engine_config("deepseek_v2"))
    assert g.mla and g.paged.chunk_nbytes == 3 * CHUNK * 576 * 2
    assert ns(cfg) == ns(cfg, tp_rank=0, tp_size=1) and "tp=replicated" in ns(cfg)
    dense = config(KVCacheGroupSpec(layer_names(3), FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=288, dtype=torch.bfloat16)))  # the same bytes a block
    assert ns(cfg) != ns(dense)


def test_fp8_caches_keep_their_bytes_under_a_namespace_naming_the_quantisation():
    fp8 = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.uint8,
                            kv_quant_mode=KVQuantMode.FP8_PER_TENSOR)
    cfg = config(KVCacheGroupSpec(layer_names(2), fp8))
    g = engine_geometry(cfg, CHUNK, engine_config(dtype="fp8_e4m3"))
    assert g.paged.chunk_nbytes == 2 * CHUNK * 2 * 2 * 8  # one byte a value: the bytes as the engine holds them
    name = ns(cfg, engine_config(dtype="fp8_e4m3"))
    assert "kv_quant=fp8_e4m3/per_tensor/checkpoint" in name
    assert name != ns(config(KVCacheGroupSpec(layer_names(2), full())))
    with pytest.raises(Unsupported, match="calculate_kv_scales"):
        engine_geometry(cfg, CHUNK, engine_config(dtype="fp8", calculate=True))


def test_pipeline_stages_name_their_layer_range():
    names = layer_names(4)
    stage0 = config(KVCacheGroupSpec(names[:2], full()))
    stage1 = config(KVCacheGroupSpec(names[2:], full()))
    g0 = engine_geometry(stage0, CHUNK, engine_config(pp=2))
    g1 = engine_geometry(stage1, CHUNK, engine_config(pp=2))
    assert (g0.stage, g1.stage) == ("0-2/4", "2-4/4") and g0.stage_labels == ("0-2/4", "2-4/4")
    assert [s.chunk_nbytes for s in g0.stages] == [g0.paged.chunk_nbytes, g1.paged.chunk_nbytes]
    assert ns(stage0, engine_config(pp=2)) != ns(stage1, engine_config(pp=2))
    with pytest.raises(Unsupported, match="not one stage"):
        engine_geometry(config(KVCacheGroupSpec(names[1:3], full())), CHUNK, engine_config(pp=2))


@pytest.mark.parametrize("spec, reason", [
    (MambaSpec(block_size=BLOCK, shapes=((4, 8),), dtypes=(torch.float32,)), "Mamba / linear-attention"),
    (CrossAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.float32), "cross-attention"),
])
def test_other_caches_are_refused_naming_the_family_and_the_reason(spec, reason):
    with pytest.raises(Unsupported, match=reason) as refused:
        engine_geometry(config(KVCacheGroupSpec(layer_names(2), spec)), CHUNK, engine_config("jamba"))
    assert refused.value.family == "jamba"


def test_a_refused_engine_shows_as_an_off_connector(start_daemon, caplog):
    d = start_daemon()
    spec = MambaSpec(block_size=BLOCK, shapes=((4, 8),), dtypes=(torch.float32,))
    cfg = vllm_config(d.address, CHUNK)
    connector = KVStoreConnector(cfg, KVConnectorRole.SCHEDULER, config(KVCacheGroupSpec(layer_names(2), spec)))
    try:
        assert [r.message for r in caplog.records if "connector off" in r.message] == [
            "kvstore vllm connector off (unknown model): Mamba / linear-attention layers keep a recurrent state, "
            "stored only with vLLM's prefix caching in its align mode (mamba_cache_mode is 'none'): enable prefix "
            "caching"]
        with d.client(namespace="kvstore-cli", use_arena=False) as c:
            [row] = c.stats()["connector_list"]
        assert (row["engine"], row["state"]) == ("vllm", "off") and row["reason"].startswith("Mamba")
        assert connector.get_num_new_matched_tokens(SimpleNamespace(request_id="r"), 0) == (0, False)
    finally:
        connector.shutdown()
