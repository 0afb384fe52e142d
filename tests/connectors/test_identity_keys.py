"""What the connectors fold into chunk keys beyond token ids: per-chunk extras in the chain, the weights'
fingerprint, the settings digest, the canonical encoding of vLLM's extra keys and the weights epoch."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import kvstore
from kvstore.connectors.common.fingerprint import WINDOW, WINDOWS, settings_digest, weights_fingerprint
from kvstore.connectors.common.keying import WEIGHTS_VERSION_PARAM, Unkeyable, WeightsEpoch, encode
from kvstore.connectors.common.model_identity import model_identity, model_settings
from kvstore.errors import ConfigError

TOKENS = list(range(64))


def test_extras_change_the_key_of_their_chunk_and_every_later_one():
    plain = kvstore.chunk_keys("ns", TOKENS, 16)
    assert kvstore.chunk_keys("ns", TOKENS, 16, extras=[b"", b""]) == plain   # empty extras fold nothing
    image = kvstore.chunk_keys("ns", TOKENS, 16, extras=[b"", b"image-1"])
    assert image[0] == plain[0] and all(x != y for x, y in zip(image[1:], plain[1:]))
    other = kvstore.chunk_keys("ns", TOKENS, 16, extras=[b"", b"image-2"])
    assert other[0] == image[0] and all(x != y for x, y in zip(other[1:], image[1:]))


def checkpoint(directory: Path, seed: int, big: int = 4 * WINDOWS * WINDOW) -> Path:
    """A two-file safetensors checkpoint: a large tensor (read by windows) and a small one (read whole)."""
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    save_file({"big": torch.randn(big // 4, generator=g), "norm": torch.randn(16, generator=g)},
              str(directory / "model-00001-of-00002.safetensors"))
    save_file({"head": torch.randn(64, 8, generator=g)}, str(directory / "model-00002-of-00002.safetensors"))
    (directory / "config.json").write_text("{}")
    return directory


def test_identical_bytes_give_one_fingerprint_wherever_they_lie(tmp_path):
    one = checkpoint(tmp_path / "host-a" / "model", seed=0)
    two = shutil.copytree(one, tmp_path / "elsewhere" / "copy")
    os.utime(two / "model-00002-of-00002.safetensors", (1, 1))   # times and paths do not count
    assert weights_fingerprint(one).digest == weights_fingerprint(two).digest
    assert weights_fingerprint(one, "full").digest == weights_fingerprint(two, "full").digest


@pytest.mark.parametrize("tensor", ["big", "norm"])
def test_one_rewritten_tensor_changes_the_fingerprint(tmp_path, tensor):
    path = checkpoint(tmp_path / "m", seed=0)
    before = weights_fingerprint(path)
    from safetensors.torch import load_file

    file = str(path / "model-00001-of-00002.safetensors")
    tensors = load_file(file)
    tensors[tensor] = torch.randn(tensors[tensor].shape, generator=torch.Generator().manual_seed(9))
    save_file(tensors, file)
    after = weights_fingerprint(path)
    assert after.digest != before.digest
    assert after.bytes_read < path.joinpath("model-00001-of-00002.safetensors").stat().st_size  # sampled


def test_full_mode_sees_a_change_between_the_windows(tmp_path):
    path = checkpoint(tmp_path / "m", seed=0)
    file = path / "model-00001-of-00002.safetensors"
    sampled, full = weights_fingerprint(path).digest, weights_fingerprint(path, "full").digest
    data = bytearray(file.read_bytes())
    length = int.from_bytes(data[:8], "little")
    start = json.loads(data[8:8 + length])["big"]["data_offsets"][0]
    data[8 + length + start + WINDOW + WINDOW // 2] ^= 0xFF   # inside "big", after its first window
    file.write_bytes(bytes(data))
    assert weights_fingerprint(path, "full").digest != full
    assert weights_fingerprint(path).digest == sampled      # the documented limit of "sampled"


def test_a_directory_without_weights_or_a_broken_header_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no weight file"):
        weights_fingerprint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ConfigError, match="not a safetensors file"):
        weights_fingerprint(tmp_path)
    with pytest.raises(ConfigError, match="fingerprint mode"):
        weights_fingerprint(tmp_path, "fast")


def test_settings_digest_is_stable_and_sees_every_value():
    settings = {"rope_scaling": {"type": "yarn", "factor": 4.0}, "kv_cache_dtype": "auto", "quantization": None}
    assert settings_digest(settings) == settings_digest(dict(reversed(list(settings.items()))))
    assert settings_digest(settings) != settings_digest({**settings, "kv_cache_dtype": "fp8"})
    assert settings_digest(settings) != settings_digest({**settings, "rope_scaling": {"type": "yarn", "factor": 2.0}})


def test_extra_keys_encode_canonically_and_refuse_what_they_cannot_encode():
    key = (("mm", "abc", 3), ("prompt_embeds", b"\x01\x02"))
    assert encode(key) == encode(tuple(list(k) for k in key))   # a list is a tuple
    assert encode(("mm", "ab", 1)) != encode(("mm", "a", "b1"))  # lengths keep fields apart
    assert encode(1) != encode("1") != encode(True)
    with pytest.raises(Unkeyable) as refused:
        encode(("mm", object()))
    assert refused.value.kind == "extra_keys"


class _Request:
    def __init__(self, params: object = None) -> None:
        self.kv_transfer_params = params


def test_a_reset_moves_the_epoch_and_a_named_version_is_shared():
    epoch = WeightsEpoch("")
    plain, named = _Request(), _Request({WEIGHTS_VERSION_PARAM: "step-7"})
    first = epoch.of(plain)
    epoch.reset()
    assert epoch.of(plain) != first
    again = epoch.of(plain)
    epoch.reset()
    assert epoch.of(plain) not in (first, again)
    assert epoch.of(named) == WeightsEpoch("other").of(named) == "named-step-7"
    with pytest.raises(Unkeyable):
        epoch.of(_Request({WEIGHTS_VERSION_PARAM: 7}))


# -- the engine-neutral model identity (common/model_identity.py) -------------------------------------------

LLAMA = {"model_type": "llama", "rope_theta": 10000.0, "_name_or_path": "/here", "transformers_version": "9"}


def test_each_engine_spelling_of_a_setting_gives_one_identity(tmp_path):
    """What two engines call the same setting in their own words is written one way: torch's dtype object or its
    name, "auto" or the model's dtype for the KV cache, "fp8" or "fp8_e4m3", a value-preserving load format or
    none; the config's local path and library version do not count."""
    path = checkpoint(tmp_path / "m", seed=0)
    one = model_settings(config=LLAMA, dtype=torch.float32, kv_cache_dtype="auto", load_format="safetensors")
    two = model_settings(config={**LLAMA, "_name_or_path": "/there", "transformers_version": "10"},
                         dtype="float32", kv_cache_dtype="torch.float32", load_format=None)
    assert model_identity(path, one) == model_identity(shutil.copytree(path, tmp_path / "copy"), two)
    fp8 = model_settings(config=LLAMA, dtype="bfloat16", kv_cache_dtype="fp8")
    assert fp8 == model_settings(config=LLAMA, dtype="torch.bfloat16", kv_cache_dtype="fp8_e4m3")


@pytest.mark.parametrize("change", [
    {"config": {**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}},
    {"dtype": "bfloat16"}, {"quantization": "fp8"}, {"kv_cache_dtype": "fp8_e5m2"}, {"kv_scales": "computed"},
    {"load_format": "bitsandbytes"},
])
def test_a_setting_that_changes_kv_at_one_shape_changes_the_identity(tmp_path, change):
    path = checkpoint(tmp_path / "m", seed=0)
    base = {"config": LLAMA, "dtype": "float32"}
    assert model_identity(path, model_settings(**{**base, **change})) != model_identity(path, model_settings(**base))


def test_random_weights_are_named_by_their_seed_and_off_by_the_name(tmp_path):
    dummy = model_settings(config=LLAMA, dtype="float32", load_format="dummy", seed=0)
    assert model_identity(None, dummy).startswith("dummy.")
    assert model_identity(None, dummy) != model_identity(None, {**dummy, "seed": 1})
    path = checkpoint(tmp_path / "m", seed=0)
    plain = model_settings(config=LLAMA, dtype="float32")
    assert model_identity(path, plain, "off") == model_identity(checkpoint(tmp_path / "n", seed=1), plain, "off")
    with pytest.raises(ConfigError):
        model_identity(tmp_path / "empty", plain)


def test_two_engines_random_weights_from_one_seed_are_not_one_model(tmp_path):
    vllm = model_settings(config=LLAMA, dtype="float32", load_format="dummy", seed=0, engine="vllm")
    sglang = model_settings(config=LLAMA, dtype="float32", load_format="dummy", seed=0, engine="sglang")
    assert model_identity(None, vllm) != model_identity(None, sglang)
    plain = model_settings(config=LLAMA, dtype="float32", engine="vllm")
    assert plain == model_settings(config=LLAMA, dtype="float32", engine="sglang")   # loaded weights: no engine


# -- one identity in every engine, and SGLang's canonical keys following its weights ----------------------------


@pytest.fixture
def sglang_wheel() -> None:
    """SGLang's interface modules, which the backend imports (skipped without them, failed under CI)."""
    from harness.servers import require_module

    require_module("sglang", "SGLang's HiCache storage interface (the sglang wheel)")


class _Weights:
    """What SGLang 0.5.23 publishes of the weights it serves (``sglang.srt.runtime_context``), as a test sets it."""

    def __init__(self, path: Path) -> None:
        from types import SimpleNamespace

        self.model = SimpleNamespace(model_path=str(path), load_format="auto", json_model_override_args="{}",
                                     quantization_param_path=None, kv_cache_dtype="auto")
        self.serving = SimpleNamespace(weight_version="default")
        self.overrides: list[tuple[str, object]] = []
        self.config = SimpleNamespace(dtype=torch.float32, quantization=None)
        self.device = SimpleNamespace(random_seed=1234)
        self.lora = SimpleNamespace(enable_lora=False, lora_paths=None)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from types import SimpleNamespace

        from sglang.srt import runtime_context as rc

        for name, value in (("get_model", lambda: self.model), ("get_serving", lambda: self.serving),
                            ("get_device", lambda: self.device), ("process_model_config", lambda: self.config),
                            ("get_lora", lambda: self.lora),
                            ("get_context", lambda: SimpleNamespace(overrides_log=lambda: list(self.overrides)))):
            monkeypatch.setattr(rc, name, value, raising=False)


def _vllm_config(path: Path) -> object:
    from types import SimpleNamespace

    model = SimpleNamespace(model=str(path), dtype=torch.float32, quantization=None, hf_overrides={}, seed=0,
                            hf_config=None, revision=None)
    return SimpleNamespace(model_config=model, cache_config=SimpleNamespace(cache_dtype="auto",
                                                                            calculate_kv_scales=False),
                           load_config=SimpleNamespace(load_format="auto"))


def test_vllm_sglang_and_transformers_compute_one_identity_of_a_checkpoint(tmp_path, monkeypatch, sglang_wheel):
    """One checkpoint at its defaults: vLLM's connector, SGLang's backend and transformers' ``checkpoint=`` make
    one model identity, and SGLang's canonical model part is vLLM's (the engines share chunks)."""
    from types import SimpleNamespace

    from kvstore.connectors.common.canonical import identity_root
    from kvstore.connectors.common.model_identity import checkpoint_identity
    from kvstore.connectors.sglang.identity import ModelKeys
    from kvstore.connectors.vllm.identity import model_identity as vllm_identity

    path = checkpoint(tmp_path / "m", seed=0)
    (path / "config.json").write_text(json.dumps({**LLAMA, "torch_dtype": "float32"}))
    weights = _Weights(path)
    weights.install(monkeypatch)
    vllm = vllm_identity(_vllm_config(path), "sampled")
    keys = ModelKeys(SimpleNamespace(mem_state=object()), "sampled", "", True)
    assert keys.identity == vllm == checkpoint_identity(path, dtype=torch.float32)
    assert keys.part() == identity_root(vllm, "")       # vLLM's part at its start (``WeightsEpoch("")``)
    versioned = ModelKeys(SimpleNamespace(mem_state=object()), "sampled", "v7", True)
    assert versioned.part() == identity_root(vllm, "v7")


def test_sglangs_canonical_part_follows_the_weights_it_serves(tmp_path, monkeypatch, sglang_wheel):
    """Whenever SGLang's keys of its own format move (weights from disk, a named weight_version, a flush under
    ``reset_on_flush``, ``clear()``), its canonical part moves with them; a flush without ``reset_on_flush``
    leaves both where they were."""
    from types import SimpleNamespace

    from kvstore.connectors.sglang.identity import UPDATE_SOURCE, ModelKeys

    path = checkpoint(tmp_path / "m", seed=0)
    weights = _Weights(path)
    weights.install(monkeypatch)
    pool = SimpleNamespace(mem_state=object())
    keys, kept = ModelKeys(pool, "sampled", "", True), ModelKeys(pool, "sampled", "", False)
    start = (keys.root(), keys.part())
    assert (kept.root(), kept.part()) == start

    def now(k: ModelKeys) -> tuple[bytes, str]:
        return k.root(), k.part()

    def moved_apart(old: tuple[bytes, str], new: tuple[bytes, str]) -> bool:
        return old[0] != new[0] and old[1] != new[1]   # both formats' keys moved

    pool.mem_state = object()                                       # a plain /flush_cache
    assert moved_apart(start, now(keys)) and now(kept) == start
    new = checkpoint(tmp_path / "new", seed=1)                      # update_weights_from_disk to other weights
    weights.model.model_path, pool.mem_state = str(new), object()
    weights.overrides.append((UPDATE_SOURCE, {}))
    from_disk = now(kept)
    assert moved_apart(start, from_disk) and now(keys) == from_disk   # the weights are named now: no epoch
    weights.serving.weight_version, pool.mem_state = "step-1", object()   # an update naming a version
    assert moved_apart(from_disk, now(kept)) and now(keys) == now(kept)
    named = now(kept)
    kept.reset()                                                    # the backend's clear()
    assert moved_apart(named, now(kept)) and now(keys) == named
