"""vLLM connector: vLLM's own base class, records and paged cache views, a real daemon, a real model's KV."""

from __future__ import annotations

import contextlib
import signal
import threading

import pytest
import torch
from harness.servers import require_module

require_module("vllm", "vLLM's interface modules (the vllm wheel, without its engine)")
pytest.importorskip("transformers")

from conftest import wait_for  # noqa: E402
from harness.engines.tiny import greedy, prefill, prompt, tiny_llama  # noqa: E402
from harness.engines.vllm_env import Engine, close_all, request  # noqa: E402

from kvstore.connectors.hf import new_cache  # noqa: E402

CHUNK = 256


@pytest.fixture(autouse=True)
def engines_closed(start_daemon):
    """Every engine a test made is shut down before its daemons are (so nothing maps their arenas then)."""
    yield
    close_all()


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
    eng.drain()
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
    assert [(s.num_chunks, s.skip_tokens, s.is_async) for s in two.last_load_meta.loads] == [(4, 0, True)]
    assert not meta.loads and not meta.saves  # loaded before it is scheduled; everything full is stored
    keys, values = kv_of(model, second)
    two.run_step(meta, lambda: two.write_kv("b", keys, values, 1024, second.shape[1]))
    assert two.received == {"b"} and two.load_errors == set()

    loaded_k, loaded_v = two.read_kv("b", 1024)
    for layer in range(len(keys)):
        assert torch.equal(loaded_k[layer], keys[layer][:, :, :1024])
        assert torch.equal(loaded_v[layer], values[layer][:, :, :1024])

    # The loaded pages, handed to the model, continue exactly like a full prefill.
    cache = new_cache(model)
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
    meta = two.admit(req, 512, 512)
    assert [(s.num_chunks, s.skip_tokens) for s in meta.loads] == [(4, 512)]
    table = two.blocks["b"]
    for cache in two.caches.values():
        for b in table[:512 // 16]:
            cache[b].fill_(7.0)  # blocks the engine's own prefix cache holds (and may share)
    two.run_step(meta)
    two.wait_loaded("b")
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
    assert one.finish(req) is True  # saves may be in flight: vLLM keeps the blocks until they are done
    one.drain(finished={"a"})
    assert one.sent == {"a"}

    two = engine(daemon, model, seed=2)
    req = request("b", ids[0].tolist())
    assert two.lookup(req) == 512
    two.run_step(two.schedule_new(req, 0, 512, 188))
    assert torch.equal(two.read_kv("b", 512)[1][3], values[3][:, :, :512])


def load_after_deleting_two_chunks(daemon, model, ids):
    """A second engine that finds all 1,024 tokens of ``ids``, then loads them after chunks 2 and 3 were deleted
    from the daemon: the engine, its load of request "b" finished (a failed load is still a finished one, with
    its unwritten blocks reported)."""
    two = engine(daemon, model, seed=2)
    req = request("b", ids[0].tolist())
    assert two.lookup(req) == 1024
    meta = two.admit(req, 0, 1024)
    side = two.scheduler.scheduler_side
    with daemon.client(namespace=side.session_namespace, key_scheme=side.key_scheme) as c:
        assert c.delete(side.plain_keys(side.stores[0], ids[0].tolist())[2:]) == 2
    two.run_step(meta)
    two.wait_loaded("b")
    return two


def test_chunk_evicted_between_lookup_and_load_is_reported(daemon, model):
    ids = torch.cat([prompt(1024, seed=7), prompt(5, seed=8)], dim=1)
    save_whole_prompt(engine(daemon, model, seed=1), model, "a", ids)
    two = load_after_deleting_two_chunks(daemon, model, ids)
    assert two.load_errors == set(two.blocks["b"][512 // 16:1024 // 16])
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
    eng.drain()
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
    eng.drain()
    assert eng.worker.stats["save_failures"] == 1
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


def test_scheduler_asks_the_daemon_once_per_request_and_batches_a_pass(daemon, model):
    eng = engine(daemon, model, extra={"lookup_batch": 64})
    ids = prompt(600, seed=12)
    save_whole_prompt(eng, model, "stored", ids)
    waiting = [request(f"w{i}", ids[0].tolist() if i % 2 else prompt(600, seed=100 + i)[0].tolist())
               for i in range(256)]
    for req in waiting:
        eng.scheduler.on_new_request(req)
    before = dict(eng.scheduler.stats)
    for _ in range(3):  # the scheduler considers every waiting request again in each pass
        found = [eng.scheduler.get_num_new_matched_tokens(req, 0)[0] for req in waiting]
    assert found == [512 if i % 2 else 0 for i in range(256)]
    calls = eng.scheduler.stats["lookup_calls"] - before.get("lookup_calls", 0)
    assert calls == 256 // 64  # one round trip per 64 waiting requests, not one per request and pass
    eng.scheduler.request_finished(waiting[0], [])
    assert not eng.scheduler.scheduler_side.looked_up("w0")


def test_producer_never_loads_and_consumer_never_saves(daemon, model):
    ids = prompt(600, seed=13)
    producer = engine(daemon, model, seed=1, role="kv_producer")
    save_whole_prompt(producer, model, "a", ids)
    assert producer.lookup(request("again", ids[0].tolist())) == 0  # stored, but a producer never loads
    consumer = engine(daemon, model, seed=2, role="kv_consumer")
    req = request("b", ids[0].tolist())
    assert consumer.lookup(req) == 512
    meta = consumer.schedule_new(req, 0, 512, 600 - 512)
    assert not meta.saves and consumer.last_load_meta.loads
    assert consumer.finish(req) is False  # nothing saved: vLLM frees its blocks at once


def test_unsupported_vllm_versions_are_refused_in_one_line():
    from kvstore.connectors.vllm import check_vllm_version
    from kvstore.errors import ConfigError

    for ok in ("0.32.0", "0.33.0", "0.33.1rc1", "0.32.0+cpu"):
        check_vllm_version(ok)
    for bad in ("0.31.2", "0.34.0", "1.0.0", "dev"):
        with pytest.raises(ConfigError, match=r"supports vLLM 0\.32 and 0\.33, not") as err:
            check_vllm_version(bad)
        assert "\n" not in str(err.value)


@contextlib.contextmanager
def stopped(daemon):
    """The daemon frozen (SIGSTOP): calls to it hang until it goes on (SIGCONT) or they time out."""
    daemon.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        daemon.proc.send_signal(signal.SIGCONT)


def test_saves_over_the_bytes_bound_are_dropped_not_waited_for(daemon, model):
    eng = engine(daemon, model, extra={"max_save_bytes": 1, "timeout": 10.0})
    ids = prompt(1100, seed=14)
    req = request("a", ids[0].tolist())
    keys, values = kv_of(model, ids)
    eng.lookup(req)
    with stopped(daemon):  # the first step's save waits on the frozen daemon, on the saver thread
        eng.run_step(eng.schedule_new(req, 0, 0, 600), lambda: eng.write_kv("a", keys, values, 0, 600))
        eng.run_step(eng.schedule_cached(req, 600, 500), lambda: eng.write_kv("a", keys, values, 600, 1100))
        assert eng.worker.stats["saves_dropped"] == 2  # the second step's chunks did not fit behind the first
        assert eng.worker.stats["chunks_saved"] == 0   # the steps returned with the first save still waiting
    assert eng.finish(req) is True
    eng.drain(finished={"a"})
    assert eng.sent == {"a"} and eng.worker.stats["chunks_saved"] == 2   # it ended once the daemon answered
    assert eng.worker.stats["save_failures"] == 0


def test_preempted_request_saves_are_settled_before_its_blocks_are_reused(daemon, model):
    from vllm.v1.core.sched.output import SchedulerOutput

    eng = engine(daemon, model, extra={"timeout": 10.0})
    ids = prompt(600, seed=15)
    req = request("a", ids[0].tolist())
    keys, values = kv_of(model, ids)
    eng.lookup(req)
    with stopped(daemon):
        eng.run_step(eng.schedule_new(req, 0, 0, 300), lambda: eng.write_kv("a", keys, values, 0, 300))
        eng.run_step(eng.schedule_cached(req, 300, 300), lambda: eng.write_kv("a", keys, values, 300, 600))
        out = SchedulerOutput.make_empty()
        out.preempted_req_ids = {"a"}
        meta = eng.scheduler.build_connector_meta(out)
        assert meta.preempted == ["a"]
        # The next step drops the queued save at once and waits for the running one before the blocks go.
        step = threading.Thread(target=eng.run_step, args=(meta,))
        step.start()
        assert wait_for(lambda: eng.worker.stats["saves_dropped"] == 1)
        assert step.is_alive()
    step.join(10)
    assert not step.is_alive() and not eng.worker.worker_side.transfers.saving("a")
    assert eng.worker.stats["chunks_saved"] == 1


def test_metadata_crosses_processes():
    import pickle

    from kvstore.connectors.vllm import KVStoreConnectorMetadata, LoadSpec, SaveSpec

    meta = KVStoreConnectorMetadata([LoadSpec("a", [1, 2], [3], 1, 0)], [SaveSpec("b", [4], [5], 0, 1)], ["c"])
    assert pickle.loads(pickle.dumps(meta)) == meta


def test_auto_loads_in_the_step_when_idle_and_off_it_when_busy(daemon, model):
    ids = prompt(600, seed=16)
    save_whole_prompt(engine(daemon, model, seed=1), model, "a", ids)
    two = engine(daemon, model, seed=2, extra={"load_async": "auto"})
    idle = request("idle", ids[0].tolist())
    assert two.lookup(idle) == 512 and two.is_async["idle"] is False  # nothing runs: load before the forward
    meta = two.schedule_new(idle, 0, 512, 600 - 512)
    assert [s.is_async for s in meta.loads] == [False]
    two.run_step(meta)
    assert two.load_errors == set() and two.received == set()  # a synchronous load is never "received"
    busy = request("busy", ids[0].tolist())
    assert two.lookup(busy) == 512 and two.is_async["busy"] is True  # "idle" is running now
    with pytest.raises(Exception, match="load_async"):
        engine(daemon, model, extra={"load_async": "sometimes"})


def test_verify_fraction_is_checked_in_one_line_and_chooses_by_request_id(daemon, model):
    from kvstore.connectors.vllm.settings import chosen_for_verify, verify_fraction
    from kvstore.errors import ConfigError

    for bad in (-0.1, 1.5, "often", None, True, float("nan")):
        with pytest.raises(ConfigError, match=r"verify_fraction must be a number from 0 to 1") as err:
            verify_fraction(bad)
        assert "\n" not in str(err.value)
    assert verify_fraction("0.25") == 0.25
    ids = [f"req-{i}" for i in range(4000)]
    assert all(chosen_for_verify(r, 1.0) for r in ids) and not any(chosen_for_verify(r, 0.0) for r in ids)
    tenth = [chosen_for_verify(r, 0.1) for r in ids]
    assert 0.08 < sum(tenth) / len(ids) < 0.12 and tenth == [chosen_for_verify(r, 0.1) for r in ids]

    tokens = prompt(600, seed=17)
    save_whole_prompt(engine(daemon, model, seed=1), model, "a", tokens)
    verifying = engine(daemon, model, seed=2, extra={"verify_fraction": 1.0})
    assert verifying.lookup(request("v", tokens[0].tolist())) == 0   # a would-be hit, computed to compare
    with pytest.raises(ConfigError, match="verify_fraction"):
        engine(daemon, model, extra={"verify_fraction": 2})


def test_vllm_connector_stats_report_each_interval_once(daemon, model):
    """`get_kv_connector_stats` (vLLM's KVConnectorStats) gives the hits, loads and misses since it last asked."""
    from kvstore.connectors.vllm import KVStoreConnector

    ids = torch.cat([prompt(1024, seed=31), prompt(5, seed=32)], dim=1)
    one = engine(daemon, model, seed=1)
    save_whole_prompt(one, model, "a", ids)
    saved = one.worker.get_kv_connector_stats().data
    assert saved["saved_chunks"] == 4 and saved["saved_bytes"] > 0 and saved["loaded_chunks"] == 0
    two = load_after_deleting_two_chunks(daemon, model, ids)
    scheduler, worker = two.scheduler.get_kv_connector_stats(), two.worker.get_kv_connector_stats()
    assert scheduler.data["hit_tokens"] == 1024 and scheduler.data["lookups"] == 1
    assert worker.data["loaded_chunks"] == 2 and worker.data["load_failures"] == 1 and worker.data["load_seconds"] > 0
    assert worker.data["loaded_bytes"] * 2 == saved["saved_bytes"]
    total = KVStoreConnector.build_kv_connector_stats(worker.to_dict()).aggregate(scheduler)
    assert total.reduce()["hit_tokens"] == 1024 and total.reduce()["loaded_chunks"] == 2
    assert two.worker.get_kv_connector_stats().is_empty() and two.scheduler.get_kv_connector_stats().is_empty()
