"""transformers connector against a real daemon: a loaded prefix continues exactly like a full prefill."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

pytest.importorskip("transformers")

from harness.engines.tiny import cache_kwarg, greedy, prefill
from harness.engines.tiny import prompt as _prompt
from harness.engines.tiny import tiny_llama as _tiny_llama

from kvstore.connectors.hf import load_prefix, model_namespace, save_prefix

CHUNK = 256
DEVICE = os.environ.get("KVSTORE_TEST_DEVICE", "cpu")  # bench/gpu_check.py runs this file with cuda
ATOL = RTOL = 1e-4 if DEVICE == "cpu" else 2e-3

if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("KVSTORE_TEST_DEVICE=cuda but no CUDA device", allow_module_level=True)


def prompt(n: int, seed: int) -> torch.Tensor:
    return _prompt(n, seed).to(DEVICE)


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32):
    return _tiny_llama(seed=seed, dtype=dtype, device=DEVICE)


def assert_continues_like_full_prefill(model, ids: torch.Tensor, cache, n: int, steps: int = 8) -> None:
    full_logits, full_cache = prefill(model, ids)
    logits, cache = prefill(model, ids, cache, start=n)
    torch.testing.assert_close(logits, full_logits[:, n:], atol=ATOL, rtol=RTOL)
    assert greedy(model, logits, cache, steps) == greedy(model, full_logits, full_cache, steps)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0)


@pytest.fixture
def kv(daemon):
    c = daemon.client(chunk_tokens=CHUNK)
    yield c
    c.close()


def test_shared_prefix_second_prompt_loads_it(kv, model):
    prefix = prompt(1024, seed=1)
    first = torch.cat([prefix, prompt(37, seed=2)], dim=1)
    second = torch.cat([prefix, prompt(50, seed=3)], dim=1)

    cache, n = load_prefix(kv, model, first)
    assert n == 0 and cache.get_seq_length() == 0
    _, cache = prefill(model, first)
    assert save_prefix(kv, model, first, cache) == 4  # 1,061 tokens: four full chunks
    assert save_prefix(kv, model, first, cache) == 0  # nothing new

    cache, n = load_prefix(kv, model, second)
    assert n == 1024 and cache.get_seq_length() == 1024
    assert_continues_like_full_prefill(model, second, cache, n)


def test_multi_turn_history_grows(kv, model):
    history = prompt(300, seed=10)
    loaded = []
    for turn in range(3):
        cache, n = load_prefix(kv, model, history)
        loaded.append(n)
        logits, cache = prefill(model, history, cache, start=n)
        if n:
            full_logits, _ = prefill(model, history)
            torch.testing.assert_close(logits, full_logits[:, n:], atol=ATOL, rtol=RTOL)
        reply = greedy(model, logits, cache, 20)
        conversation = torch.cat([history, torch.tensor([reply], device=DEVICE)], dim=1)
        save_prefix(kv, model, conversation, cache)  # the cache holds history + reply (less the last token)
        history = torch.cat([conversation, prompt(180, seed=20 + turn)], dim=1)
    # turn 0: nothing; turn 1: 300 + 20 + 180 = 500 tokens, 319 held -> 256; turn 2: 700 -> 512
    assert loaded == [0, 256, 512]


def test_prompt_fully_cached_leaves_last_token_to_compute(kv, model):
    ids = prompt(512, seed=30)
    _, cache = prefill(model, ids)
    assert save_prefix(kv, model, ids, cache) == 2
    cache, n = load_prefix(kv, model, ids)
    assert n == 256  # 512 tokens: the second chunk would leave nothing to compute
    assert_continues_like_full_prefill(model, ids, cache, n)


def test_other_weights_or_dtype_never_hit(kv, model):
    ids = prompt(600, seed=40)
    _, cache = prefill(model, ids)
    save_prefix(kv, model, ids, cache)
    assert load_prefix(kv, model, ids)[1] == 512
    other = tiny_llama(seed=1)
    assert model_namespace(other, CHUNK) != model_namespace(model, CHUNK)
    assert load_prefix(kv, other, ids)[1] == 0
    half = tiny_llama(seed=0, dtype=torch.bfloat16)
    assert load_prefix(kv, half, ids)[1] == 0


def test_one_process_saves_another_loads(daemon, kv, model, tmp_path):
    ids = prompt(800, seed=50)
    torch.save(ids.cpu(), tmp_path / "ids.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(__import__("support.paths").paths.TESTS)!r})
        import kvstore
        from harness.engines.tiny import tiny_llama, prefill
        from kvstore.connectors.hf import save_prefix
        model = tiny_llama(seed=0, device={DEVICE!r})
        ids = torch.load({str(tmp_path / "ids.pt")!r}).to({DEVICE!r})
        _, cache = prefill(model, ids)
        with kvstore.connect({daemon.address!r}, chunk_tokens={CHUNK}) as c:
            print(save_prefix(c, model, ids, cache))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "3"
    cache, n = load_prefix(kv, model, ids)
    assert n == 768
    assert_continues_like_full_prefill(model, ids, cache, n)


def test_daemon_down_means_normal_prefill(start_daemon, model):
    d = start_daemon()
    c = d.client(chunk_tokens=CHUNK, timeout=0.5)
    ids = prompt(600, seed=60)
    _, cache = prefill(model, ids)
    d.stop()
    assert save_prefix(c, model, ids, cache) == 0
    cache, n = load_prefix(c, model, ids)
    assert n == 0 and cache.get_seq_length() == 0
    c.close()


def test_generate_accepts_loaded_cache(kv, model):
    ids = prompt(700, seed=70)
    _, cache = prefill(model, ids)
    save_prefix(kv, model, ids, cache)
    cache, n = load_prefix(kv, model, ids)
    assert n == 512
    with torch.no_grad():
        full = model.generate(ids, max_new_tokens=6, do_sample=False)
        fast = model.generate(ids, max_new_tokens=6, do_sample=False, **{cache_kwarg(model): cache})
    assert torch.equal(full, fast)


def _damage_stored(kv, payload_views: list[bytes]) -> None:
    from support.scribble import damage

    damage(kv.server_info["arena"]["path"], payload_views, offset=67)   # the top byte of a float32: sign, exponent


def _stored_bytes(kv, keys) -> list[bytes]:
    with kv.get(keys) as views:
        return [bytes(v) for v in views]


@pytest.mark.parametrize("damaged", [False, True])
def test_verify_fraction_one_compares_instead_of_loading(kv, model, damaged):
    from kvstore.connectors.hf import _store

    ids = prompt(900, seed=80 + damaged)
    _, cache = prefill(model, ids)
    assert save_prefix(kv, model, ids, cache) == 3
    store = _store(kv, model, "")
    keys = store.keys(ids[0])[:3]
    assert wait_for_sums(kv)
    if damaged:
        _damage_stored(kv, _stored_bytes(kv, keys)[1:2])   # chunk 1 of 3: a flipped byte deep in its KV
    before = kv.stats()["verify"]

    cache, n = load_prefix(kv, model, ids, verify_fraction=1.0)
    assert n == 768 and cache.get_seq_length() == 768
    full_logits, full_cache = prefill(model, ids)
    logits, cache = prefill(model, ids, cache, start=n)
    torch.testing.assert_close(logits, full_logits[:, n:], atol=ATOL, rtol=RTOL)
    assert greedy(model, logits, cache, 8) == greedy(model, full_logits, full_cache, 8)

    after = kv.stats()["verify"]
    assert after["checks"] - before["checks"] == 3
    assert after["mismatches"] - before["mismatches"] == (1 if damaged else 0)
    if damaged:
        assert kv.lookup(keys) == 1 and after["dropped"] - before["dropped"] == 2   # no damaged chain is left
        assert after["max_difference"] > 1e-3
    else:
        assert kv.lookup(keys) == 3 and after["max_difference"] <= 1e-4


def wait_for_sums(kv) -> bool:
    from conftest import wait_for

    return wait_for(lambda: kv.stats()["integrity"]["sums_pending"] == 0, 10)


def test_a_batch_of_input_ids_is_refused_in_one_line_and_each_row_works_alone(kv, model):
    import kvstore

    rows = torch.cat([prompt(300, seed=90), prompt(300, seed=91)], dim=0)   # 2 x 300: a batch
    _, batch_cache = prefill(model, rows)
    for call in (lambda: save_prefix(kv, model, rows, batch_cache), lambda: load_prefix(kv, model, rows)):
        with pytest.raises(kvstore.UsageError, match=r"input_ids must be one sequence, a 1 x T tensor; got "
                                                     r"\(2, 300\): call load_prefix and save_prefix once per row"):
            call()
    for i in range(2):   # nothing was stored under keys that chain one row onto the other; a row alone works
        row = rows[i:i + 1]
        assert load_prefix(kv, model, row)[1] == 0
        _, cache = prefill(model, row)
        assert save_prefix(kv, model, row, cache) == 1
        cache, n = load_prefix(kv, model, row)
        assert n == 256
        assert_continues_like_full_prefill(model, row, cache, n)


def documented_snippet(page: str) -> str:
    """The python block of ``page`` (relative to the repository) that uses the transformers connector."""
    import re

    from support.paths import ROOT

    with open(os.path.join(ROOT, page)) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.DOTALL)
    return next(block for block in blocks if "connectors.hf" in block)


@pytest.mark.parametrize("page", ["README.md", "docs/connectors/transformers.md"])
def test_the_documented_snippet_runs_warning_free_on_the_installed_transformers(daemon, model, monkeypatch, page):
    import functools
    import warnings

    import kvstore

    snippet = documented_snippet(page)
    monkeypatch.setattr(kvstore, "connect", functools.partial(kvstore.connect, daemon.address))   # its daemon
    ids = prompt(600, seed=41)
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a deprecated name is a FutureWarning: it fails here
        for _ in range(2):   # a miss that saves, then a hit that loads
            scope = {"model": model, "input_ids": ids}
            exec(snippet, scope)
            scope["client"].close()
            found.append(scope["n"])
    assert found == [0, 512]


class OldNames(torch.nn.Module):
    """A causal LM whose forward pass takes and returns the cache as ``past_key_values``, as transformers did
    before the rename (the installed release underneath, called by its current name)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.dtype = inner.dtype
        self.device = inner.device

    def forward(self, input_ids, past_key_values=None, use_cache=None):
        out = self.inner(input_ids, cache=past_key_values, use_cache=use_cache)
        return types.SimpleNamespace(logits=out.logits, past_key_values=out.cache)


def test_cache_kwargs_and_output_cache_follow_either_name_and_verification_runs_on_both(kv, model):
    from kvstore.connectors.hf import cache_kwargs, new_cache, output_cache

    import warnings

    for seed, lm in enumerate((model, OldNames(model))):
        ids = prompt(600, seed=43 + seed)   # the same weights: a prompt of its own for each
        cache = new_cache(lm)
        assert list(cache_kwargs(lm, cache)) == (["cache"] if lm is model else ["past_key_values"])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = lm(ids, use_cache=True, **cache_kwargs(lm, cache))
            assert output_cache(out) is cache
            assert save_prefix(kv, lm, ids, output_cache(out)) == 2
            loaded, n = load_prefix(kv, lm, ids, verify_fraction=1.0)   # the connector's own forward pass
        assert n == 512 and loaded.get_seq_length() == 512
