"""The namespace is a fingerprint of the chunk layout: two layouts of one model never read each other's chunks."""

from __future__ import annotations

import itertools

import pytest
import torch

from kvstore.connectors.common.store import ChunkStore
from kvstore.connectors.common.families import ChunkLayout, Family, StageRange, Unsupported, attention_kind, mla_layout
from kvstore.connectors.common.layout import KVGeometry, namespace

T = 16
MODEL = "hf:tiny@abc#0123"


def dense(layers: int = 4, dtype: torch.dtype = torch.float32, **kw) -> ChunkLayout:
    return ChunkLayout(Family.DENSE, KVGeometry(layers, 2, 8, dtype, T), **kw)


def mla(layers: int = 4, rank: int = 32, rope: int = 8, **kw) -> ChunkLayout:
    return mla_layout(layers, rank, rope, torch.float32, T, **kw)


# Layouts of one model that hold different bytes (or the same bytes of different layers, or of a cache with
# other windows): each needs its own namespace.
LAYOUTS = {
    "dense": dense(),
    "dense bf16": dense(dtype=torch.bfloat16),
    "dense 2 layers": dense(layers=2),
    "swa": dense(attention=("swa64", "full")),
    "swa other window": dense(attention=("swa128", "full")),
    "chunked local": dense(attention=("local32", "full")),
    "fp8": dense(dtype=torch.uint8, kv_quant="fp8_e4m3/per_tensor/checkpoint"),
    "stage 0": dense(layers=2, stage=StageRange(0, 2, 4)),
    "stage 1": dense(layers=2, stage=StageRange(2, 4, 4)),
    "mla": mla(),
    "mla other rank": mla(rank=16, rope=24),   # same width, other split
    "mla swa": mla(attention=("swa64", "full")),
}


def test_every_layout_has_its_own_namespace():
    names = {label: layout.namespace(MODEL) for label, layout in LAYOUTS.items()}
    for (a, na), (b, nb) in itertools.combinations(names.items(), 2):
        assert na != nb, f"{a} and {b} share a namespace"


def test_plain_dense_keeps_its_historic_namespace_and_names_the_rank():
    layout = dense()
    assert layout.namespace(MODEL, tp_rank=1, tp_size=2) == namespace(MODEL, layout.geometry, tp_rank=1, tp_size=2)
    assert layout.namespace(MODEL, tp_rank=0, tp_size=2) != layout.namespace(MODEL, tp_rank=1, tp_size=2)


def test_mla_namespace_names_no_rank_so_one_copy_serves_every_rank_and_tp_size():
    layout = mla()
    names = {layout.namespace(MODEL, tp_rank=r, tp_size=n) for n in (1, 2, 8) for r in range(n)}
    assert len(names) == 1 and "tp=replicated" in names.pop()
    assert layout.replicated and not dense().replicated


def test_layouts_that_cannot_be_are_refused():
    with pytest.raises(ValueError, match="one plane"):
        ChunkLayout(Family.MLA, KVGeometry(2, 2, 8, torch.float32, T), mla_split=(4, 4))
    with pytest.raises(ValueError, match="add up"):
        ChunkLayout(Family.MLA, KVGeometry(2, 1, 8, torch.float32, T, planes=1), mla_split=(4, 2))
    with pytest.raises(ValueError, match="does not hold"):
        dense(layers=3, stage=StageRange(0, 2, 4))
    with pytest.raises(ValueError, match="outside"):
        StageRange(2, 6, 4)
    assert attention_kind() == "full" and attention_kind(sliding_window=4) == "swa4"
    assert attention_kind(attention_chunk=8) == "local8"
    line = Unsupported("jamba", "Mamba layers keep a recurrent state").line("vllm")
    assert line == "kvstore vllm connector off (jamba): Mamba layers keep a recurrent state"


def test_stage_layout_holds_its_own_layers_under_a_name_for_its_range():
    whole = dense(layers=4, attention=("swa64", "full"))
    second = whole.for_stage(StageRange(2, 4, 4))
    assert second.geometry.num_layers == 2 and second.attention == whole.attention
    assert "layers=2-4/4" in second.namespace(MODEL)


def test_two_layouts_of_one_prompt_never_read_each_others_chunks(client):
    """Same model, same tokens, same chunk size: what one layout stored is a miss for every other layout."""
    tokens = torch.arange(3 * T)
    stored = {}
    for label, layout in LAYOUTS.items():
        store = ChunkStore(client, layout.namespace(MODEL), layout.geometry)
        keys = store.keys(tokens)
        assert store.lookup(keys) == 0, f"{label} found chunks another layout stored"
        chunks = torch.randn(len(keys), *layout.geometry.chunk_shape).to(layout.geometry.dtype)
        assert store.store(keys, chunks, 0) == len(keys)
        stored[label] = (store, keys, chunks)
    for label, (store, keys, chunks) in stored.items():   # and each reads back its own bytes, exactly
        assert torch.equal(store.load(keys), chunks), label
