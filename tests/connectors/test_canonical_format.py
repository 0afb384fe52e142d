"""The engine-neutral chunk format (``connectors/common/canonical.py``): SGLang's own page chain computed from token
ids, keys that commit to model, format and extras, and the tensor-parallel slices a reader can assemble."""

from __future__ import annotations

import pytest
import torch

from kvstore.connectors.common import canonical as c

# SGLang 0.5.23's own page keys (``sglang.srt.mem_cache.utils.get_hash_str`` and ``get_storage_hash_str``, run in
# its engine virtualenv) of the token ids 3..42 in pages of 16: the last, partial page is left out here (storage
# holds full pages only).
TOKENS = list(range(3, 43))
SGLANG_PAGES = ["822b603a2fd410621ab42df58f129105595585dbe1bfedab593e66d0baa820c5",
                "0dac926c0c811613cb6ee3234a95faa7574f117a96a795f79ca7680ed4a4ae97"]
SGLANG_SALTED = ["3b88fe063c7ca87b295880e3911da0a388c148e13b2a407c03804bc494f0b124",
                 "0f9b1217296418a32c9fb48e4865c7a751e222cc398517629d14e10b453af968"]
SGLANG_SEEDS = {("salt-a", None): "b2ffaae86ab83722f3e84a225a3436cc877f5368c772911aa0aade19ee83c0dd",
                (None, "ek"): "c9b4ebd63c142d8064027806d6975e34556c9f950c474181b255c3fba351995e"}


def test_page_chain_is_sglangs():
    assert [p.hex() for p in c.page_hashes(TOKENS, 16)] == SGLANG_PAGES
    assert [p.hex() for p in c.page_hashes(TOKENS, 16, c.storage_seed(None, "salt-a"))] == SGLANG_SALTED
    for (salt, extra), want in SGLANG_SEEDS.items():
        assert c.storage_seed(extra, salt).hex() == want
    assert c.storage_seed(None, None) is None
    assert c.page_hashes(torch.tensor([TOKENS]), 16) == c.page_hashes(TOKENS, 16)


def test_keys_commit_to_model_format_salt_and_extras():
    pages = c.page_hashes(TOKENS * 4, 16)
    root = c.chunk_root(c.identity_root("w.s"), c.format_name(2, 2, 16, torch.float32, 16))
    keys = c.chunk_keys(root, pages)
    assert len(set(keys)) == len(keys) == len(pages)
    for other in (c.chunk_root(c.identity_root("w.t"), c.format_name(2, 2, 16, torch.float32, 16)),
                  c.chunk_root(c.identity_root("w.s", "v2"), c.format_name(2, 2, 16, torch.float32, 16)),
                  c.chunk_root(c.identity_root("w.s", lora="a"), c.format_name(2, 2, 16, torch.float32, 16)),
                  c.chunk_root(c.identity_root("w.s"), c.format_name(2, 2, 16, torch.bfloat16, 16)),
                  c.chunk_root(c.identity_root("w.s"), c.format_name(2, 2, 16, torch.float32, 16), "salt")):
        assert not set(c.chunk_keys(other, pages)) & set(keys)
    # extras from chunk 1 on: chunk 0 keeps its key, every later one differs (even where its own extras are empty)
    mixed = c.chunk_keys(root, pages, [b"", b"image", b""])
    assert mixed[0] == keys[0] and all(a != b for a, b in zip(mixed[1:], keys[1:]))
    assert c.chunk_keys(root, pages, [b"", b"", b""]) == keys


def test_request_root_round_trip():
    for salt in (None, "", "a;b:c", "x" * 40):
        root = c.request_root(salt, c.identity_root("id", "e"))
        got_salt, rest = c.split_request_root(root)
        assert (got_salt or None, rest) == (salt or None, c.identity_root("id", "e"))


@pytest.mark.parametrize("tp,total,want", [(1, 8, [(0, 8)]), (2, 8, [(0, 4), (4, 8)]),
                                           (4, 2, [(0, 1), (0, 1), (1, 2), (1, 2)])])
def test_rank_heads(tp, total, want):
    assert [c.rank_heads(r, tp, total) for r in range(tp)] == want


def test_covering_slices_read_any_tp_size():
    assert c.covering_slices(0, 8, 8) == [[(0, 8)], [(0, 4), (4, 8)], [(0, 2), (2, 4), (4, 6), (6, 8)],
                                          [(h, h + 1) for h in range(8)]]
    ways = c.covering_slices(4, 8, 8)
    assert ways[:3] == [[(4, 8)], [(0, 8)], [(4, 6), (6, 8)]]
    assert [(2, 4)] not in ways and c.covering_slices(2, 3, 4) == [[(2, 3)], [(0, 4)], [(2, 4)]]
    key = bytes(16)
    assert c.slice_key(key, 0, 8, 8) == key
    assert len({c.slice_key(key, a, b, 8) for a, b in [(0, 4), (4, 8), (0, 2)]}) == 3


def test_model_identity_is_engine_neutral(tmp_path):
    """The canonical keys' model identity is ``common/model_identity.py``'s, whatever engine spells the settings."""
    import json

    from safetensors.torch import save_file

    from kvstore.connectors.common.model_identity import checkpoint_identity

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float32",
                                                      "transformers_version": "4.1"}))
    save_file({"w": torch.arange(10, dtype=torch.float32)}, str(tmp_path / "model.safetensors"))
    base = checkpoint_identity(tmp_path, dtype="auto")
    assert checkpoint_identity(tmp_path, dtype=torch.float32, kv_cache_dtype="auto") == base
    assert checkpoint_identity(tmp_path, dtype="float32", quantization="None") == base
    assert checkpoint_identity(tmp_path, dtype="fp32") == base
    assert checkpoint_identity(tmp_path, dtype="bfloat16") != base
    assert checkpoint_identity(tmp_path, dtype="float32", overrides={"rope_theta": 5.0}) != base
    save_file({"w": torch.arange(10, dtype=torch.float32) + 1}, str(tmp_path / "model.safetensors"))
    assert checkpoint_identity(tmp_path, dtype="float32") != base


def _cpu_block_write(cache: torch.Tensor, block: int, t: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Write token `t` of `block` where vLLM 0.32's CPU kernels (``cpu_attn_reshape_and_cache``, ``vec``/``vec16``)
    put it, as measured by writing known values through them: per head, K at ``d * block_size + t`` and V at
    ``block_size * head_dim + t * head_dim + d`` of the head's ``2 * block_size * head_dim`` values."""
    _, heads, n, c = cache.shape
    d = c // 2
    flat = cache[block].view(heads, 2 * n * d)
    for h in range(heads):
        flat[h, torch.arange(d) * n + t] = k[h]
        flat[h, n * d + t * d + torch.arange(d)] = v[h]


@pytest.mark.parametrize("content", ["cpu", "split"])
def test_block_codec_reads_and_writes_vllm_blocks_in_the_chunk_layout(content):
    from kvstore.connectors.common.block_codec import BlockCodec

    layers, heads, block, dim, blocks = 2, 2, 8, 4, 6
    caches = [torch.zeros(blocks, heads, block, 2 * dim) for _ in range(layers)]
    g = torch.Generator().manual_seed(0)
    k = torch.randn(layers, 2 * block, heads, dim, generator=g)
    v = torch.randn(layers, 2 * block, heads, dim, generator=g)
    ids = [4, 1]   # the chunk's two blocks, out of order
    for layer, cache in enumerate(caches):
        for t in range(2 * block):
            b, pos = ids[t // block], t % block
            if content == "cpu":
                _cpu_block_write(cache, b, pos, k[layer, t], v[layer, t])
            else:
                cache[b, :, pos, :dim], cache[b, :, pos, dim:] = k[layer, t], v[layer, t]
    codec = BlockCodec(caches, content)
    raw = torch.empty(layers * 2 * 2 * block * heads * dim * 4, dtype=torch.uint8)
    codec.save(ids, raw)
    chunk = raw.view(torch.float32).view(layers, 2, 2 * block, heads, dim)
    assert torch.equal(chunk[:, 0], k) and torch.equal(chunk[:, 1], v)

    fresh = [torch.zeros_like(c) for c in caches]
    BlockCodec(fresh, content).load(raw, [2, -1])   # the second block is held already: left alone
    for before, after in zip(caches, fresh):
        assert torch.equal(after[2], before[4]) and not after[1].any()
