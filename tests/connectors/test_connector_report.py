"""A connector that is off says so: one line in the engine's log, a row in `kvstore stats`, a gauge on /metrics."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import kvstore
from conftest import wait_for
from support.scrape import free_port, scrape, value

ENGINE = """
import sys
from kvstore.connectors.common.families import Unsupported
from kvstore.connectors.common.report import hold_off_report
refusal = Unsupported("jamba", "Mamba / linear-attention layers keep a recurrent state, not a per-token KV cache")
held = hold_off_report(sys.argv[1], "vllm", refusal)
print("held" if held is not None else "none", flush=True)
sys.stdin.read()
"""


def connectors(daemon) -> list[dict]:
    with daemon.client(namespace="kvstore-cli", use_arena=False) as c:
        return c.stats()["connector_list"]


def test_off_connector_shows_in_stats_cli_and_metrics_while_it_runs(start_daemon):
    port = free_port()
    d = start_daemon("--metrics-port", str(port))
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, d.address], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert engine.stdout.readline().strip() == "held"
    [row] = connectors(d)
    assert (row["engine"], row["family"], row["state"]) == ("vllm", "jamba", "off")
    assert row["reason"].startswith("Mamba / linear-attention layers")
    assert value(scrape(port), "kvstore_connectors", engine="vllm", state="off") == 1
    out = subprocess.run([sys.executable, "-m", "kvstore", "stats", "--address", d.address],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "jamba" in out.stdout and "off" in out.stdout, out.stdout + out.stderr
    engine.communicate("", timeout=60)  # the engine exits: the daemon drops its session and the report with it
    assert wait_for(lambda: connectors(d) == [], timeout=20)


def test_sglang_backend_reports_on_and_off(start_daemon):
    pytest.importorskip("sglang")
    from support.engines.sglang_env import MLAHostPool, storage_config
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    d = start_daemon()
    extra = {"backend_name": "kvstore", "module_path": "kvstore.connectors.sglang",
             "class_name": "KVStoreHiCacheStorage", "interface_v1": 1, "address": d.address}

    class StatePool:  # no per-head KV: what a Mamba state pool offers a storage backend
        layout, layer_num, page_size, dtype = "layer_first", 2, 16, torch.float32

    off = StorageBackendFactory.create_backend("dynamic", storage_config(extra), StatePool())
    off.register_mem_pool_host(StatePool())
    on_pool = MLAHostPool("layer_first", 2, 32, 16, 16, 2)
    on = StorageBackendFactory.create_backend("dynamic", storage_config(extra, mla=True), on_pool)
    on.register_mem_pool_host(on_pool)
    assert on.batch_exists(["0" * 64]) == 0  # the backend's client connects on first use
    rows = sorted((r["engine"], r["family"], r["state"]) for r in connectors(d))
    assert rows == [("sglang", "StatePool", "off"), ("sglang", "mla", "on")]


@pytest.mark.parametrize("bad", [
    {"engine": "vLLM!", "state": "off"}, {"engine": "vllm", "state": "maybe"}, "off",
    {"engine": "vllm", "state": "off", "reason": "x" * 5000},
])
def test_bad_connector_report_is_one_clear_refusal(daemon, bad):
    with pytest.raises(kvstore.RequestError) as exc:
        kvstore.connect(daemon.address, use_arena=False, connector=bad, timeout=5)
    assert "connector" in str(exc.value) or "reason" in str(exc.value)
    with daemon.client() as c:  # the daemon keeps serving
        c.ping()
