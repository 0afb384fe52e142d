"""Hybrid models (attention and Mamba-2 / linear-attention layers) with constructed KV cache configs (vLLM's own
spec classes): what a chunk holds, which state block a save takes and a load writes, and the namespace.

The real engine (a GraniteMoeHybrid-shaped model on the CPU build) is `test_vllm_engine_hybrid.py`'s.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from harness.servers import require_module

require_module("vllm", "vLLM's interface modules (the vllm wheel, without its engine)")

import harness.engines.vllm_env  # noqa: E402, F401 - vLLM's CPU platform, before any vLLM module resolves one
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec,
)

from kvstore.connectors.common.families import Unsupported  # noqa: E402
from kvstore.connectors.common.layout import paged_namespace  # noqa: E402
from kvstore.connectors.common.transfers import Transfers  # noqa: E402
from kvstore.connectors.vllm.geometry import KEEP, NULL_BLOCK, engine_geometry  # noqa: E402
from kvstore.connectors.vllm.hybrid import state_rows  # noqa: E402
from kvstore.connectors.vllm.records import LoadSpec  # noqa: E402
from kvstore.connectors.vllm.worker import has_state_target  # noqa: E402
from kvstore.ops import PagedKV  # noqa: E402

BLOCK = CHUNK = 256
CONV, SSM = (3, 48), (4, 8, 16)          # per layer: conv state, then SSM state (heads, head dim, state)


def attention(**kw):
    return FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.float32, **kw)


def state(mode: str = "align", shapes=(CONV, SSM), dtypes=(torch.float32, torch.float32), block: int = BLOCK, **kw):
    return MambaSpec(block_size=block, shapes=shapes, dtypes=dtypes, mamba_cache_mode=mode, **kw)


def hybrid(spec=None) -> KVCacheConfig:
    """As vLLM reports Granite 4 (GraniteMoeHybrid): an attention group and a state group, each its own table."""
    groups = [KVCacheGroupSpec(["model.layers.1.self_attn.attn", "model.layers.3.self_attn.attn"], attention()),
              KVCacheGroupSpec(["model.layers.0.mamba", "model.layers.2.mamba"], spec or state())]
    return KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=groups)


def engine_config(model_type: str = "granitemoehybrid"):
    return SimpleNamespace(
        model_config=SimpleNamespace(hf_config=SimpleNamespace(model_type=model_type),
                                     hf_text_config=SimpleNamespace(num_hidden_layers=4)),
        parallel_config=SimpleNamespace(pipeline_parallel_size=1, tensor_parallel_size=1),
        cache_config=SimpleNamespace(cache_dtype="auto", calculate_kv_scales=False),
        device_config=SimpleNamespace(device_type="cpu"))


def ns(cfg) -> str:
    return paged_namespace("m", engine_geometry(cfg, CHUNK, engine_config()).paged)


def test_a_chunk_holds_its_attention_kv_and_the_state_at_its_last_token():
    g = engine_geometry(hybrid(), CHUNK, engine_config())
    assert [x.kind for x in g.groups] == ["full", "state"] and g.hybrid and g.frees_blocks
    state_size = (48 * 3 + 4 * 8 * 16) * 4
    assert g.paged.chunk_nbytes == 2 * attention().page_size_bytes + 2 * state_size   # one state a layer
    assert "state(n=2,type=mamba2,shapes=3x48/4x8x16,dtypes=float32/float32,bytes=2624" in ns(hybrid())
    padded = engine_geometry(hybrid(state(page_size_padded=4 * state_size)), CHUNK, engine_config())
    assert padded.paged.chunk_nbytes == g.paged.chunk_nbytes and ns(hybrid()) == ns(hybrid(state(
        page_size_padded=4 * state_size)))                                            # padding is not stored


def test_the_state_layout_and_dtype_are_part_of_the_format():
    names = {ns(hybrid()), ns(hybrid(state(shapes=(CONV, (4, 8, 8))))),
             ns(hybrid(state(dtypes=(torch.bfloat16, torch.float32)))),
             ns(hybrid(state(shapes=((48, 3), SSM))))}
    assert len(names) == 4


@pytest.mark.parametrize("spec, chunk, reason", [
    (state(mode="none"), CHUNK, "align mode"),
    (state(mode="all"), CHUNK, "align mode"),
    (state(), 2 * CHUNK, "chunk_tokens 512 must equal the hybrid block size 256"),
    (state(num_speculative_blocks=1), CHUNK, "speculative"),
])
def test_states_a_chunk_cannot_hold_are_refused_in_one_line(spec, chunk, reason):
    with pytest.raises(Unsupported, match=reason) as refused:
        engine_geometry(hybrid(spec), chunk, engine_config())
    assert refused.value.family == "granitemoehybrid" and "\n" not in refused.value.line("vllm")


def test_a_save_takes_a_chunk_only_in_the_step_that_ends_on_its_last_token():
    g = engine_geometry(hybrid(), CHUNK, engine_config())
    table = [[1, 2, 3], [4, 5, 6]]
    assert g.valid_chunks(table, 0, 3, 0, computed=3 * CHUNK) == 2        # the state of chunk 2 only
    assert g.valid_chunks(table, 2, 3, 2 * CHUNK, computed=3 * CHUNK) == 2
    assert g.valid_chunks(table, 0, 2, 0, computed=2 * CHUNK + 7) == 2    # the step went past it: none
    nulled = [[1, 2, 3], [4, 5, NULL_BLOCK]]
    assert g.valid_chunks(nulled, 0, 3, 0, computed=3 * CHUNK) == 3        # not the request's block: none
    assert g.chunk_blocks(table, 2) == [[3], [6]]


def test_a_load_writes_the_last_chunks_state_into_the_block_vllm_reads():
    g = engine_geometry(hybrid(), CHUNK, engine_config())
    # Off the step: the blocks of the loaded tokens, the last one the state's (vLLM copies it on).
    off_step = [[7, 8, 9], [NULL_BLOCK, NULL_BLOCK, 5]]
    assert [g.chunk_blocks(off_step, c, state_chunk=2)[1] for c in range(3)] == [[KEEP], [KEEP], [5]]
    # In the step: vLLM already copied the (null) boundary block into the running block, the last one.
    in_step = [[7, 8, 9, 10], [NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, 6]]
    assert g.chunk_blocks(in_step, 2, state_chunk=2) == [[9], [6]]
    assert g.chunk_blocks(in_step, 1, state_chunk=2) == [[8], [KEEP]]
    spec = LoadSpec("r", [], in_step, 3, 0)
    assert has_state_target(g, spec)
    spec.block_ids = [[7, 8, 9], [NULL_BLOCK, NULL_BLOCK, NULL_BLOCK]]
    assert not has_state_target(g, spec)                                # refused: recomputed, never stateless


def test_the_state_travels_inside_the_chunk_bytes():
    g = engine_geometry(hybrid(), CHUNK, engine_config())
    torch.manual_seed(0)
    size = state().state_content_size_bytes
    page = size + 100                                                  # vLLM pads state pages to attention's
    src = [[torch.randn(8, 2, BLOCK, 16) for _ in range(2)], [torch.randint(-128, 127, (8, 1, 1, page),
                                                                            dtype=torch.int8) for _ in range(2)]]
    dst = [[torch.zeros_like(t) for t in group] for group in src]

    def caches(groups):
        return [PagedKV.from_blocks(groups[0], BLOCK), PagedKV.from_blocks([state_rows(t, size) for t in groups[1]], 1)]

    a, b = Transfers(caches(src), None, None, 1), Transfers(caches(dst), None, None, 1)
    try:
        chunk = torch.empty(g.paged.chunk_nbytes, dtype=torch.uint8)
        a._gather(g.chunk_blocks([[1, 2], [3, 4]], 1), chunk, None)          # chunk 1: attention block 2, state 4
        b._scatter(chunk, g.chunk_blocks([[5, 6], [NULL_BLOCK, 7]], 1, state_chunk=1))
    finally:
        a.close()
        b.close()
    for s, d in zip(src[0], dst[0]):
        assert torch.equal(d[6], s[2])
    for s, d in zip(src[1], dst[1]):
        assert torch.equal(d[7, ..., :size], s[4, ..., :size]) and not d[7, ..., size:].any()
        assert not d[NULL_BLOCK].any()


def test_the_groups_are_named_for_the_events_as_vllm_names_them():
    from kvstore.connectors.vllm.hybrid import event_groups

    assert event_groups(hybrid()) == (("full_attention", None), ("mamba", None))
    untransferred = hybrid()
    untransferred.kv_cache_groups[1].enable_kv_transfer = False
    assert event_groups(untransferred) == ()
