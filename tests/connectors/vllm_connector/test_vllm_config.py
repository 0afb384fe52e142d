"""The vLLM connector's typed config: every key of `kv_connector_extra_config`, its type, default and range."""

from __future__ import annotations

import dataclasses

import pytest
from harness.servers import require_module

require_module("vllm", "vLLM's interface modules (the vllm wheel, without its engine)")

from kvstore.connectors.vllm.config import VllmConnectorConfig  # noqa: E402
from kvstore.connectors.vllm.retention import Retention  # noqa: E402
from kvstore.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.unit

GOOD = {
    "address": ("ipc:///tmp/k.sock", "ipc:///tmp/k.sock"),
    "chunk_tokens": (512, 512),
    "load_async": (True, "async"),
    "save_async": (False, False),
    "max_save_bytes": (1, 1),
    "lookup_batch": (8, 8),
    "timeout": (0.5, 0.5),
    "retry_s": (0, 0.0),
    "model_id": ("m@rev", "m@rev"),
    "cache_salt": ("s", "s"),
    "gpu_tier": (False, False),
    "verify_fraction": (0.25, 0.25),
    "engine_id": ("pod-1", "pod-1"),
    "served_model_name": ("org/llama", "org/llama"),
    "fingerprint": ("full", "full"),
    "weights_version": ("step-7", "step-7"),
    "priority_retention": ({"5": "low", 0: "pin"}, ((0, Retention.PIN), (5, Retention.LOW))),
}

BAD = {
    "address": [3],
    "chunk_tokens": [0, -256, "256", 25.5, True],
    "load_async": ["sometimes", 2],
    "save_async": ["maybe", 1],
    "max_save_bytes": [0, "1G"],
    "lookup_batch": [0, None],
    "timeout": [0, -1, "2", float("nan")],
    "retry_s": [-0.1, "5"],
    "model_id": [7],
    "cache_salt": [None, 1],
    "gpu_tier": ["yes", 0],
    "verify_fraction": [2, -0.1, True, "x"],
    "engine_id": [7, "pod 7", "p" * 129],
    "served_model_name": [7, "a@b"],
    "priority_retention": [["low"], {"x": "low"}, {"1": "keep"}],
    "fingerprint": ["fast", True, None],
    "weights_version": [None, 3],
}


def test_defaults():
    config = VllmConnectorConfig.from_extra(None)
    assert config == VllmConnectorConfig.from_extra({}) == VllmConnectorConfig()
    assert (config.address, config.chunk_tokens, config.load_async, config.save_async) == (None, 256, "auto", True)
    assert (config.max_save_bytes, config.lookup_batch, config.timeout, config.retry_s) == (1 << 30, 64, 2.0, 5.0)
    assert (config.model_id, config.cache_salt, config.gpu_tier, config.verify_fraction) == (None, "", True, 0.0)


def test_every_key_is_covered():
    assert sorted(GOOD) == sorted(BAD) == sorted(VllmConnectorConfig.known_keys())


@pytest.mark.parametrize("key", sorted(GOOD))
def test_each_key_is_read(key):
    given, expected = GOOD[key]
    assert getattr(VllmConnectorConfig.from_extra({key: given}), key) == expected


@pytest.mark.parametrize("key,value", [(k, v) for k, values in sorted(BAD.items()) for v in values])
def test_a_bad_value_is_refused_in_one_line_naming_the_key(key, value):
    with pytest.raises(ConfigError) as caught:
        VllmConnectorConfig.from_extra({key: value})
    assert key in str(caught.value) and "\n" not in str(caught.value)


def test_an_unknown_key_is_refused_naming_it_and_the_known_keys():
    with pytest.raises(ConfigError) as caught:
        VllmConnectorConfig.from_extra({"chunk_tokens": 256, "chunk_token": 256})
    message = str(caught.value)
    assert "'chunk_token'" in message and "\n" not in message
    assert all(key in message for key in VllmConnectorConfig.known_keys())


def test_string_booleans_and_empty_model_id():
    config = VllmConnectorConfig.from_extra({"save_async": "false", "gpu_tier": "True", "load_async": "false",
                                             "model_id": ""})
    assert (config.save_async, config.gpu_tier, config.load_async, config.model_id) == (False, True, "sync", None)


def test_the_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        VllmConnectorConfig().timeout = 1.0  # type: ignore[misc]


def test_engine_identity_defaults_to_host_and_served_model_and_checks_what_is_configured():
    import socket
    from types import SimpleNamespace

    from kvstore.connectors.vllm.settings import vllm_engine_identity as engine_identity

    def vllm_config(dp_rank: int, dp_size: int, served: object) -> SimpleNamespace:
        return SimpleNamespace(model_config=SimpleNamespace(model="org/llama", served_model_name=served),
                               parallel_config=SimpleNamespace(data_parallel_rank=dp_rank, data_parallel_size=dp_size))

    one = engine_identity(vllm_config(0, 1, ["llama 8b", "alias"]), None, None)
    assert one.engine_id.startswith(socket.gethostname()[:8].replace(" ", "_")) and one.model == "llama_8b"
    assert one.dp_rank == 0
    dp = engine_identity(vllm_config(3, 4, None), "pod-7", None)
    assert dp.engine_id == "pod-7" and dp.model == "org/llama" and dp.dp_rank == 3
    assert engine_identity(vllm_config(1, 2, None), None, "m").engine_id.endswith("-dp1")
    for bad_id, bad_model in (("pod 7", None), ("pod", "a@b")):
        with pytest.raises(ConfigError, match="engine_id/served_model_name") as err:
            engine_identity(vllm_config(0, 1, None), bad_id, bad_model)
        assert "\n" not in str(err.value)
    config = VllmConnectorConfig.from_extra({"engine_id": "pod-1", "served_model_name": "llama"})
    assert (config.engine_id, config.served_model_name) == ("pod-1", "llama")
