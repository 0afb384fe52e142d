"""vLLM connector: vLLM's own base class, records and paged cache views, a real daemon, a real model's KV."""

from __future__ import annotations

import pytest
import torch
from servers import require_module

require_module("vllm", "vLLM's interface modules (the vllm wheel, without its engine)")
pytest.importorskip("transformers")

from engines.tiny import greedy, prefill, prompt, tiny_llama  # noqa: E402
from engines.vllm_env import Engine, request  # noqa: E402

from kvstore.connectors.hf import _new_cache  # noqa: E402

CHUNK = 256


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0)


def kv_of(model, ids):
    from kvstore.connectors.hf import _cache_layers

    _, cache = prefill(model, ids)
    return _cache_layers(cache)


def engine(daemon_or_address, model, **kw) -> Engine:
    address = getattr(daemon_or_address, "address", daemon_or_address)
    cfg = model.config
    return Engine(address, cfg.num_hidden_layers, cfg.num_key_value_heads,
                  cfg.hidden_size // cfg.num_attention_heads, chunk_tokens=CHUNK, **kw)


def save_whole_prompt(eng: Engine, model, req_id: str, ids: torch.Tensor, salt: str | None = None):
    req = request(req_id, ids[0].tolist(), cache_salt=salt)
    ext = eng.lookup(req)
    meta = eng.schedule_new(req, 0, ext, ids.shape[1] - ext)
    keys, values = kv_of(model, ids)
    eng.run_step(meta, lambda: eng.write_kv(req_id, keys, values, ext, ids.shape[1]))
    return meta


def test_shared_prefix_loads_into_other_blocks_and_continues_like_full_prefill(daemon, model):
    prefix = prompt(1024, seed=1)
    first = torch.cat([prefix, prompt(37, seed=2)], dim=1)
    second = torch.cat([prefix, prompt(50, seed=3)], dim=1)

    one = engine(daemon, model, seed=1)
    meta = save_whole_prompt(one, model, "a", first)
    assert [(s.first_chunk, s.num_chunks) for s in meta.saves] == [(0, 4)]

    two = engine(daemon, model, seed=2)  # another engine: its own caches and block order
    req = request("b", second[0].tolist())
    assert two.lookup(req) == 1024
    meta = two.schedule_new(req, 0, 1024, second.shape[1] - 1024)
    assert [(s.num_chunks, s.skip_tokens) for s in meta.loads] == [(4, 0)]
    assert not meta.saves  # everything full is already stored
    keys, values = kv_of(model, second)
    assert two.run_step(meta, lambda: two.write_kv("b", keys, values, 1024, second.shape[1])) == (None, None)
    assert two.worker.get_block_ids_with_load_errors() == set()

    loaded_k, loaded_v = two.read_kv("b", 1024)
    for layer in range(len(keys)):
        assert torch.equal(loaded_k[layer], keys[layer][:, :, :1024])
        assert torch.equal(loaded_v[layer], values[layer][:, :, :1024])

    # The loaded pages, handed to the model, continue exactly like a full prefill.
    cache = _new_cache(model)
    for layer, (k, v) in enumerate(zip(loaded_k, loaded_v)):
        cache.update(k, v, layer)
    logits, cache = prefill(model, second, cache, start=1024)
    full_logits, full_cache = prefill(model, second)
    torch.testing.assert_close(logits, full_logits[:, 1024:], atol=1e-4, rtol=1e-4)
    assert greedy(model, logits, cache, 8) == greedy(model, full_logits, full_cache, 8)


def test_engine_prefix_cache_hit_is_left_alone(daemon, model):
    ids = torch.cat([prompt(1024, seed=4), prompt(10, seed=5)], dim=1)
    save_whole_prompt(engine(daemon, model, seed=1), model, "a", ids)

    two = engine(daemon, model, seed=3)
    req = request("b", ids[0].tolist())
    assert two.lookup(req, local_tokens=512) == 512
    meta = two.schedule_new(req, 512, 512, ids.shape[1] - 1024)
    assert [(s.num_chunks, s.skip_tokens) for s in meta.loads] == [(4, 512)]
    table = two.blocks["b"]
    for cache in two.caches.values():
        for b in table[:512 // 16]:
            cache[b].fill_(7.0)  # blocks the engine's own prefix cache holds (and may share)
    two.run_step(meta)
    k, _ = two.read_kv("b", 1024)
    keys, _ = kv_of(model, ids)
    assert torch.all(k[0][:, :, :512] == 7.0)
    assert torch.equal(k[0][:, :, 512:], keys[0][:, :, 512:1024])


def test_chunked_prefill_saves_chunks_as_they_complete(daemon, model):
    ids = prompt(700, seed=6)
    keys, values = kv_of(model, ids)
    one = engine(daemon, model, seed=1)
    req = request("a", ids[0].tolist())
    assert one.lookup(req) == 0
    meta = one.schedule_new(req, 0, 0, 300)
    assert [(s.first_chunk, s.num_chunks) for s in meta.saves] == [(0, 1)]
    one.run_step(meta, lambda: one.write_kv("a", keys, values, 0, 300))
    meta = one.schedule_cached(req, 300, 400)
    assert [(s.first_chunk, s.num_chunks) for s in meta.saves] == [(1, 1)]
    one.run_step(meta, lambda: one.write_kv("a", keys, values, 300, 700))
    assert one.scheduler.request_finished(req, one.blocks["a"]) == (False, None)

    two = engine(daemon, model, seed=2)
    req = request("b", ids[0].tolist())
    assert two.lookup(req) == 512
    two.run_step(two.schedule_new(req, 0, 512, 188))
    assert torch.equal(two.read_kv("b", 512)[1][3], values[3][:, :, :512])


def test_chunk_evicted_between_lookup_and_load_is_reported(daemon, model):
    ids = torch.cat([prompt(1024, seed=7), prompt(5, seed=8)], dim=1)
    save_whole_prompt(engine(daemon, model, seed=1), model, "a", ids)
    two = engine(daemon, model, seed=2)
    req = request("b", ids[0].tolist())
    assert two.lookup(req) == 1024
    meta = two.schedule_new(req, 0, 1024, 5)
    store = two.scheduler._stores[0]
    with daemon.client() as c:
        assert c.delete(store.keys(ids[0].tolist())[2:]) == 2
    two.run_step(meta)
    assert two.worker.get_block_ids_with_load_errors() == set(two.blocks["b"][512 // 16:1024 // 16])
    assert two.worker.get_block_ids_with_load_errors() == set()


def test_cache_salt_and_other_models_never_hit(daemon, model):
    ids = prompt(600, seed=9)
    save_whole_prompt(engine(daemon, model, seed=1), model, "a", ids, salt="tenant-1")
    two = engine(daemon, model, seed=2)
    assert two.lookup(request("b", ids[0].tolist())) == 0
    assert two.lookup(request("c", ids[0].tolist(), cache_salt="tenant-2")) == 0
    assert two.lookup(request("d", ids[0].tolist(), cache_salt="tenant-1")) == 512
    other = engine(daemon, model, seed=2, extra={"model_id": "another-model"})
    assert other.lookup(request("e", ids[0].tolist(), cache_salt="tenant-1")) == 0


def test_bfloat16_pages_round_trip_bit_exact(daemon):
    eng = Engine(daemon.address, layers=3, kv_heads=4, head_dim=8, dtype=torch.bfloat16, chunk_tokens=64)
    n = 200
    keys = [torch.randn(1, 4, n, 8).to(torch.bfloat16) for _ in range(3)]
    values = [torch.randn(1, 4, n, 8).to(torch.bfloat16) for _ in range(3)]
    ids = list(range(1000, 1000 + n))
    req = request("a", ids)
    eng.lookup(req)
    eng.run_step(eng.schedule_new(req, 0, 0, n), lambda: eng.write_kv("a", keys, values, 0, n))
    two = Engine(daemon.address, layers=3, kv_heads=4, head_dim=8, dtype=torch.bfloat16, chunk_tokens=64, seed=5)
    req = request("b", ids)
    assert two.lookup(req) == 192
    two.run_step(two.schedule_new(req, 0, 192, n - 192))
    k, v = two.read_kv("b", 192)
    for layer in range(3):
        assert torch.equal(k[layer].view(torch.int16), keys[layer][:, :, :192].view(torch.int16))
        assert torch.equal(v[layer].view(torch.int16), values[layer][:, :, :192].view(torch.int16))


def test_daemon_down_means_zero_hits_and_normal_steps(model, tmp_path):
    eng = engine(f"ipc://{tmp_path}/nobody.sock", model, extra={"timeout": 0.3})
    ids = prompt(600, seed=10)
    keys, values = kv_of(model, ids)
    req = request("a", ids[0].tolist())
    assert eng.lookup(req) == 0
    meta = eng.schedule_new(req, 0, 0, 600)
    assert eng.run_step(meta, lambda: eng.write_kv("a", keys, values, 0, 600)) == (None, None)
    assert eng.lookup(request("b", ids[0].tolist())) == 0


def test_daemon_dies_mid_run(start_daemon, model):
    d = start_daemon()
    ids = prompt(600, seed=11)
    one = engine(d, model, seed=1, extra={"timeout": 0.5})
    save_whole_prompt(one, model, "a", ids)
    d.kill()
    req = request("b", ids[0].tolist())
    assert one.lookup(req) == 0
    one.run_step(one.schedule_new(req, 0, 0, 600))  # saves fail quietly
