"""kvstore's connector stats with the engine virtualenv's vLLM: its logger finds the class from the engine config,
rebuilds the workers' and the scheduler's stats, aggregates them and logs kvstore's counters."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from harness.engines.vllm_real import REPO, require_engine

pytestmark = pytest.mark.engine

SCRIPT = r'''
import json, pickle
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging, KVConnectorStats
from kvstore.connectors.vllm import KVStoreConnector
from kvstore.connectors.vllm.stats import KVStoreConnectorStats

config = KVTransferConfig(kv_connector="KVStoreConnector", kv_connector_module_path="kvstore.connectors.vllm",
                          kv_role="kv_both")
logging = KVConnectorLogging(config)
worker_a = KVStoreConnectorStats(data={"loaded_chunks": 2, "loaded_bytes": 200, "load_seconds": 0.25})
worker_b = pickle.loads(pickle.dumps(KVStoreConnectorStats(data={"loaded_chunks": 3, "loaded_bytes": 300,
                                                                 "load_failures": 1, "saved_chunks": 1})))
scheduler = KVStoreConnector.build_kv_connector_stats({"hit_tokens": 1280, "lookups": 2})
step = worker_a.aggregate(worker_b).aggregate(scheduler)
logging.observe(step.to_dict())
logging.observe(KVStoreConnectorStats(data={"hit_tokens": 256}).to_dict())
lines = []
logging.log(lambda fmt, *args: lines.append(fmt % args))
empty = KVStoreConnector.build_kv_connector_stats(None)
reset = KVStoreConnectorStats(data={"lookups": 1})
reset.reset()
print(json.dumps({"cls": logging.connector_cls is KVStoreConnector, "base": isinstance(step, KVConnectorStats),
                  "reduced": step.reduce(), "lines": lines, "empty": empty.is_empty(), "reset": reset.is_empty(),
                  "after_log": logging.transfer_stats_accumulator is None}))
'''


def test_vllm_logger_aggregates_and_logs_kvstore_stats(tmp_path):
    python = require_engine()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(PYTHONPATH=str(REPO), HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / ".cache"),
               VLLM_TARGET_DEVICE="cpu")
    done = subprocess.run([python, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["cls"] and got["base"] and got["empty"] and got["reset"] and got["after_log"]
    assert got["reduced"]["loaded_chunks"] == 5 and got["reduced"]["loaded_bytes"] == 500
    assert got["reduced"]["hit_tokens"] == 1280 and got["reduced"]["load_failures"] == 1
    [line] = got["lines"]
    assert line.startswith("KV Transfer metrics: ") and "hit_tokens=1536" in line and "loaded_chunks=5" in line
