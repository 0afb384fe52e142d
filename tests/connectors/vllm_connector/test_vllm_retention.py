"""A request's retention class (`kvstore_retention` in its ``kv_transfer_params``): parsing, and the scheduler
side's plan for a ``no-store`` request (its chunks still load; nothing it computes is saved)."""

from __future__ import annotations

import logging

import pytest
from harness.servers import require_module

require_module("vllm", "vLLM's interface modules (the vllm wheel, without its engine)")
pytest.importorskip("transformers")

from harness.engines.tiny import prompt, tiny_llama  # noqa: E402
from harness.engines.vllm_env import Engine, close_all, request  # noqa: E402

from kvstore.connectors.vllm.config import VllmConnectorConfig  # noqa: E402
from kvstore.connectors.vllm.retention import (PIN_TTL_FIELD, RETENTION_FIELD, Retention,  # noqa: E402
                                               request_retention, retention_of)
from kvstore.errors import ConfigError  # noqa: E402

CHUNK = 256
NO_STORE = {RETENTION_FIELD: "no-store"}


@pytest.mark.parametrize("params, want", [
    (None, Retention.NORMAL),
    ({}, Retention.NORMAL),
    ({"do_remote_prefill": True}, Retention.NORMAL),
    ({RETENTION_FIELD: "normal"}, Retention.NORMAL),
    ({RETENTION_FIELD: "no-store"}, Retention.NO_STORE),
    ({RETENTION_FIELD: "pin"}, Retention.PIN),
    ({RETENTION_FIELD: "high"}, Retention.HIGH),
    ({RETENTION_FIELD: "low"}, Retention.LOW),
])
def test_retention_read_from_kv_transfer_params(params, want, caplog):
    with caplog.at_level(logging.WARNING, logger="kvstore.connectors.vllm"):
        assert retention_of(params, "r1") is want
    assert not caplog.records


@pytest.mark.parametrize("value", ["no_store", "NO-STORE", "", 1, None, ["no-store"]])
def test_unknown_retention_is_ignored_with_one_warning(value, caplog):
    with caplog.at_level(logging.WARNING, logger="kvstore.connectors.vllm"):
        assert retention_of({RETENTION_FIELD: value}, "r1") is Retention.NORMAL
    [line] = [r.getMessage() for r in caplog.records]
    assert repr(value) in line and "pin, high, normal, low, no-store" in line and "r1" in line


def test_only_no_store_forbids_saves():
    assert all(r.saves for r in Retention if r is not Retention.NO_STORE) and not Retention.NO_STORE.saves


def test_a_pin_carries_its_ttl_and_a_bad_ttl_is_ignored_with_a_warning(caplog):
    assert request_retention({RETENTION_FIELD: "pin", PIN_TTL_FIELD: 30}).pin_ttl == 30.0
    assert request_retention({RETENTION_FIELD: "pin"}).pin_ttl is None
    assert request_retention({RETENTION_FIELD: "high", PIN_TTL_FIELD: 30}).pin_ttl is None
    with caplog.at_level(logging.WARNING, logger="kvstore.connectors.vllm"):
        assert request_retention({RETENTION_FIELD: "pin", PIN_TTL_FIELD: -1}, "r9").pin_ttl is None
    [line] = [r.getMessage() for r in caplog.records]
    assert "r9" in line and "kvstore_pin_ttl=-1" in line


def test_priority_picks_a_class_only_through_the_table():
    table = VllmConnectorConfig.from_extra({"priority_retention": {"10": "low", "-1": "pin", "0": "high"}})
    by = table.priority_retention
    assert by == ((-1, Retention.PIN), (0, Retention.HIGH), (10, Retention.LOW))
    assert [retention_of(None, "r", p, by) for p in (-5, -1, 0, 3, 10, 11)] == [
        Retention.PIN, Retention.PIN, Retention.HIGH, Retention.LOW, Retention.LOW, Retention.NORMAL]
    assert retention_of({RETENTION_FIELD: "no-store"}, "r", -5, by) is Retention.NO_STORE   # the field wins
    assert retention_of(None, "r", -5) is Retention.NORMAL   # no table: priority is not used


@pytest.mark.parametrize("table, why", [
    ({"x": "low"}, "'x' is not a whole-number priority"),
    ({"0": "keep"}, "priority '0' maps to 'keep', not one of pin, high, normal, low, no-store"),
    (["low"], "must be a table of priority -> class"),
])
def test_a_bad_priority_table_is_refused_in_one_line(table, why):
    with pytest.raises(ConfigError, match=why):
        VllmConnectorConfig.from_extra({"priority_retention": table})


@pytest.fixture
def engines(daemon):
    """A function making engines on `daemon`; every one is shut down before the daemon is."""
    model = tiny_llama(seed=0)
    cfg = model.config

    def make(seed: int) -> Engine:
        return Engine(daemon.address, cfg.num_hidden_layers, cfg.num_key_value_heads,
                      cfg.hidden_size // cfg.num_attention_heads, chunk_tokens=CHUNK, seed=seed)

    yield make
    close_all()


def test_no_store_request_plans_no_save(engines):
    ids = prompt(600, seed=5)[0].tolist()
    eng = engines(1)
    normal, quiet = request("a", ids), request("b", ids, kv_transfer_params=NO_STORE)
    assert eng.lookup(normal) == 0 and eng.lookup(quiet) == 0
    assert [(s.first_chunk, s.num_chunks) for s in eng.schedule_new(normal, 0, 0, len(ids)).saves] == [(0, 2)]
    assert eng.schedule_new(quiet, 0, 0, len(ids)).saves == []
    assert eng.schedule_cached(quiet, len(ids), 1).saves == []   # nor in a later step
    assert eng.scheduler.stats.get("save_specs") == 1


def test_unknown_retention_warns_once_per_request_and_saves(engines, caplog):
    ids = prompt(600, seed=7)[0].tolist()
    eng = engines(1)
    odd = request("a", ids, kv_transfer_params={RETENTION_FIELD: "forever"})
    with caplog.at_level(logging.WARNING, logger="kvstore.connectors.vllm"):
        eng.lookup(odd)
        eng.lookup(odd)   # asked again (not scheduled the first time): read once
    assert len([r for r in caplog.records if "forever" in r.getMessage()]) == 1
    assert [(s.first_chunk, s.num_chunks) for s in eng.schedule_new(odd, 0, 0, len(ids)).saves] == [(0, 2)]


def test_no_store_request_still_loads(engines):
    ids = prompt(600, seed=6)
    one = engines(1)
    saver = request("a", ids[0].tolist())
    one.lookup(saver)
    meta = one.schedule_new(saver, 0, 0, ids.shape[1])
    one.run_step(meta)
    one.drain()
    two = engines(2)
    quiet = request("b", ids[0].tolist(), kv_transfer_params=NO_STORE)
    assert two.lookup(quiet) == 2 * CHUNK
    meta = two.schedule_new(quiet, 0, 2 * CHUNK, ids.shape[1] - 2 * CHUNK)
    assert [(s.num_chunks, s.skip_tokens) for s in two.last_load_meta.loads] == [(2, 0)]
    assert two.received == {"b"} and two.load_errors == set()
    assert meta.saves == []


def test_saves_carry_the_class_and_ttl_to_the_daemon(engines, daemon):
    ids = prompt(600, seed=8)[0].tolist()
    eng = engines(1)
    pinned = request("p", ids, kv_transfer_params={RETENTION_FIELD: "pin", PIN_TTL_FIELD: 120})
    eng.lookup(pinned)
    meta = eng.schedule_new(pinned, 0, 0, len(ids))
    assert [(s.retention, s.pin_ttl) for s in meta.saves] == [("pin", 120.0)]
    eng.run_step(meta)
    eng.drain()
    with daemon.client() as client:
        assert client.stats()["retention"]["pinned_chunks"] == 2
