"""Gather/scatter between paged KV caches and the chunk layout: every layout, both implementations, on CPU."""

from __future__ import annotations

import pytest
import torch

from conftest import require_native

from kvstore import native
from kvstore.ops import PagedKV, gather, registry, scatter

L, NB, BS, H, D = 3, 12, 4, 2, 8


@pytest.fixture(scope="module", params=["torch", "native"])
def kernels(request):
    if request.param == "torch":
        return registry.TORCH
    require_native("copy")
    return registry.select(torch.device("cpu"), "native")


def expected_chunk(caches: list[torch.Tensor], ids: list[int], kv_dim: int) -> torch.Tensor:
    """The chunk layout, built the slow obvious way: [layers, 2, tokens, heads*dim]."""
    planes = []
    for layer in caches:
        for kv in range(2):
            blocks = layer[kv][ids] if kv_dim == 0 else layer[ids, kv]
            planes.append(blocks.reshape(len(ids) * BS, H * D))
    return torch.stack(planes).reshape(L, 2, len(ids) * BS, H * D)


@pytest.mark.parametrize("kv_dim", [0, 1], ids=["flash_attn", "flashinfer"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vllm_layouts_round_trip(kernels, kv_dim, dtype):
    shape = (2, NB, BS, H, D) if kv_dim == 0 else (NB, 2, BS, H, D)
    caches = [torch.randn(shape).to(dtype) for _ in range(L)]
    ids = [7, 2, 11]
    chunk = gather(PagedKV.from_vllm(caches), ids, kernels=kernels)
    assert chunk.dtype == torch.uint8
    assert torch.equal(chunk.view(dtype).reshape(L, 2, -1, H * D), expected_chunk(caches, ids, kv_dim))

    targets = [torch.zeros(shape, dtype=dtype) for _ in range(L)]
    scatter(PagedKV.from_vllm(targets), chunk, [0, 5, 9], kernels=kernels)
    for src, dst in zip(caches, targets):
        pick = (slice(None), [0, 5, 9]) if kv_dim == 0 else ([0, 5, 9],)
        orig = (slice(None), ids) if kv_dim == 0 else (ids,)
        assert torch.equal(dst[pick], src[orig])
        untouched = [b for b in range(NB) if b not in (0, 5, 9)]
        rest = (slice(None), untouched) if kv_dim == 0 else (untouched,)
        assert not dst[rest].any()


def test_separate_k_v_and_token_indexed_pools(kernels):
    ks = [torch.randn(NB, BS, H, D) for _ in range(L)]
    vs = [torch.randn(NB, BS, H, D) for _ in range(L)]
    chunk = gather(PagedKV.from_kv_pairs(ks, vs), [3, 4], kernels=kernels).view(torch.float32)
    first = chunk.reshape(L, 2, 2 * BS, H * D)
    assert torch.equal(first[1, 1], vs[1][[3, 4]].reshape(2 * BS, H * D))

    slots = NB * BS  # an SGLang-style token pool: [slots, heads, dim] per layer
    kt = [torch.randn(slots, H, D) for _ in range(L)]
    vt = [torch.randn(slots, H, D) for _ in range(L)]
    kv = PagedKV.from_kv_pairs(kt, vt)
    assert kv.block_size == 1
    picks = [40, 3, 17, 18]
    chunk = gather(kv, picks, kernels=kernels)
    assert torch.equal(chunk.view(torch.float32).reshape(L, 2, 4, H * D)[2, 0], kt[2][picks].reshape(4, H * D))
    out_k = [torch.zeros_like(t) for t in kt]
    out_v = [torch.zeros_like(t) for t in vt]
    scatter(PagedKV.from_kv_pairs(out_k, out_v), chunk, picks, kernels=kernels)
    assert all(torch.equal(o[picks], s[picks]) for o, s in zip(out_v, vt))


def test_partial_last_block_leaves_the_rest_of_the_block_alone(kernels):
    caches = [torch.randn(2, NB, BS, H, D) for _ in range(L)]
    tokens = 2 * BS + 1  # the third block holds one token of this chunk
    chunk = gather(PagedKV.from_vllm(caches), [1, 2, 3], num_tokens=tokens, kernels=kernels)
    assert chunk.numel() == L * 2 * tokens * H * D * 4
    targets = [torch.full((2, NB, BS, H, D), 7.0) for _ in range(L)]
    scatter(PagedKV.from_vllm(targets), chunk, [4, 5, 6], num_tokens=tokens, kernels=kernels)
    for src, dst in zip(caches, targets):
        assert torch.equal(dst[:, 4:6], src[:, 1:3])
        assert torch.equal(dst[:, 6, :1], src[:, 3, :1])
        assert (dst[:, 6, 1:] == 7.0).all()


def test_bad_requests_are_refused(kernels):
    caches = [torch.randn(2, NB, BS, H, D) for _ in range(L)]
    kv = PagedKV.from_vllm(caches)
    with pytest.raises(IndexError, match="outside"):
        gather(kv, [0, NB], kernels=kernels)
    with pytest.raises(IndexError):  # ids given as a tensor are checked by the kernel itself
        gather(kv, torch.tensor([0, -1]), kernels=kernels)
    with pytest.raises(ValueError, match="holds"):
        scatter(kv, torch.zeros(10, dtype=torch.uint8), [0], kernels=kernels)
    with pytest.raises(ValueError, match="do not fill"):
        gather(kv, [0, 1], num_tokens=BS, kernels=kernels)
    with pytest.raises(ValueError, match="same shape"):
        PagedKV.from_vllm([caches[0], torch.randn(2, NB + 1, BS, H, D)])


# vLLM 0.32+ per-layer caches: logical [blocks, heads, block_size, 2 * head_dim] in three physical orders
BLOCK_LAYOUTS = {
    "LBHNC": (0, 1, 2, 3),  # the physical order, as a permutation of the logical axes
    "LBNHC": (0, 2, 1, 3),
    "LHBNC": (1, 0, 2, 3),  # heads outside the block axis: a block is not one run of memory
}


def block_cache(order: tuple[int, ...], fill: float | None = None) -> torch.Tensor:
    logical = (NB, H, BS, 2 * D)
    physical = [logical[i] for i in order]
    t = torch.randn(physical) if fill is None else torch.full(physical, fill)
    inverse = [order.index(i) for i in range(4)]
    return t.permute(inverse)  # the logical view the engine hands out


@pytest.mark.parametrize("name", list(BLOCK_LAYOUTS))
def test_block_planes_copy_blocks_as_stored(kernels, name):
    order = BLOCK_LAYOUTS[name]
    caches = [block_cache(order) for _ in range(L)]
    kv = PagedKV.from_blocks(caches, BS)
    assert not kv.token_major
    assert len(kv.rows) == (L * H if name == "LHBNC" else L)
    ids = [7, 2, 11]
    chunk = gather(kv, ids, kernels=kernels)
    assert chunk.numel() == L * len(ids) * H * BS * 2 * D * 4
    if name == "LBHNC":  # one plane per layer: the chunk is [layers, blocks, block bytes]
        assert torch.equal(chunk.view(torch.float32).view(L, 3, H, BS, 2 * D)[1, 2], caches[1][11])
    targets = [block_cache(order, 0.0) for _ in range(L)]
    scatter(PagedKV.from_blocks(targets, BS), chunk, [0, 5, 9], kernels=kernels)
    for src, dst in zip(caches, targets):
        assert torch.equal(dst[[0, 5, 9]], src[ids])
        assert not dst[[b for b in range(NB) if b not in (0, 5, 9)]].any()


def test_block_planes_skip_blocks_and_refuse_partial_blocks(kernels):
    caches = [block_cache(BLOCK_LAYOUTS["LBHNC"]) for _ in range(L)]
    chunk = gather(PagedKV.from_blocks(caches, BS), [3, 4, 5], kernels=kernels)
    targets = [block_cache(BLOCK_LAYOUTS["LBHNC"], 7.0) for _ in range(L)]
    kv = PagedKV.from_blocks(targets, BS)
    scatter(kv, chunk, [8, 1, 2], skip_blocks=1, kernels=kernels)
    for src, dst in zip(caches, targets):
        assert (dst[8] == 7.0).all()  # the engine's own block, left alone
        assert torch.equal(dst[[1, 2]], src[[4, 5]])
    with pytest.raises(ValueError, match="whole blocks"):
        gather(kv, [0, 1], num_tokens=BS + 1, kernels=kernels)
    with pytest.raises(ValueError, match="skip"):
        scatter(kv, chunk, [8, 1, 2], skip_blocks=4, kernels=kernels)


def test_registry_choice_and_override(monkeypatch):
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="unknown"):
        registry.select(cpu, "magic")
    monkeypatch.setenv("KVSTORE_KERNELS", "torch")
    assert registry.select(cpu) is registry.TORCH
    monkeypatch.setenv("KVSTORE_NATIVE", "off")
    native.forget()
    monkeypatch.setenv("KVSTORE_KERNELS", "native")
    assert registry.select(cpu) is registry.TORCH  # not available: the portable path runs
    with pytest.raises(RuntimeError, match="not available: the C library was not built"):
        registry.select(cpu, "native")
    native.forget()
