"""One KV format every engine reads, in real engines: a prefix SGLang saved is loaded by vLLM, one vLLM saved by
SGLang and by transformers, through one daemon; vLLM and SGLang at TP=2 (each rank its KV head) load what the
TP=1 engines saved, and they load what each saved.

One random-weight float32 Llama directory serves all three (SGLang with `--page-size` 256, the vLLM connector's
`chunk_tokens`, and `reset_on_flush` false: the tests flush its caches). Each engine starts once for the module:
vLLM at TP=1, SGLang, vLLM at TP=2, SGLang at TP=2. Every load must give the loading engine's own plain prefill:
the same greedy tokens and log-probabilities within 1e-3. An engine's plain prefill of a prompt is its run under a
cache salt no other request uses, so nothing of it is cached anywhere (a salt seeds the page chain and changes no
value).
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import pytest

from conftest import wait_for
from kvstore.connectors.common import canonical
from harness.daemons import keep_dirs, short_tempdir
from harness.engines import sglang_real, vllm_real
from harness.engines.sandbox import engine_home_env

pytestmark = pytest.mark.timeout(1800)   # two engine starts on a small, shared CPU machine

CHUNK = 256            # the vLLM connector's chunk_tokens and SGLang's page size
LENGTH = 1100          # four whole chunks and a tail
CHUNKS = (LENGTH - 1) // CHUNK
TOL = 1e-3


@pytest.fixture(scope="module")
def workdir() -> Iterator[str]:
    sglang_real.require_engine()
    vllm_real.require_engine()
    path = short_tempdir("xe-")
    yield path
    if not keep_dirs():
        import shutil

        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def model(workdir) -> str:
    """The model every engine serves (saved by the SGLang virtualenv's transformers, with its tokenizer)."""
    python = sglang_real.require_engine()
    return sglang_real.save_model(python, os.path.join(workdir, "model"), "shared", engine_home_env(workdir))


@pytest.fixture(scope="module")
def daemon(start_module_daemon, workdir) -> Any:
    return start_module_daemon("--host-mem", "512MiB", workdir=workdir)


@pytest.fixture(scope="module")
def vllm(workdir, model, daemon) -> Iterator[vllm_real.EngineProc]:
    pool = vllm_real.EnginePool()
    pool.use_workdir(workdir)
    pool.use_model(model)
    yield pool.get("cross", connector=pool.connector(), max_model_len=4096)
    pool.keep()


@pytest.fixture(scope="module")
def sglang(workdir, model, daemon) -> Iterator[sglang_real.SGLangServer]:
    """SGLang keeping its keys across a plain ``/flush_cache`` (``reset_on_flush`` false): the tests flush its own
    caches to make it load from storage, and a flush that moved its keys would key its pages apart from vLLM's."""
    flags = sglang_real.hicache_flags(daemon.address, reset_on_flush=False)
    server = sglang_real.SGLangServer(sglang_real.require_engine(), model, ["--page-size", str(CHUNK), *flags],
                                      workdir, "cross")
    yield server
    server.close()


A = vllm_real.prompts(2, LENGTH, seed=101)    # saved by vLLM
B = vllm_real.prompts(2, LENGTH, seed=102)    # saved by SGLang


def sglang_generate(engine: sglang_real.SGLangServer, batch: list[list[int]], **request: Any) -> list[dict]:
    """One request a prompt (a cache salt applies to one request)."""
    return [engine.generate([p], **request)[0] for p in batch]


def assert_same(got: list[dict], want: list[dict]) -> None:
    """The same greedy tokens, every log-probability within TOL (the differences are printed: 0 to 5e-7 here)."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g["tokens"] == w["tokens"], f"prompt {i}: tokens differ"
        first = abs(g["logprobs"][0] - w["logprobs"][0])
        worst = max(abs(a - b) for a, b in zip(g["logprobs"], w["logprobs"]))
        print(f"prompt {i}: first-token log-probability difference {first:.2e}, any token {worst:.2e}")
        assert worst <= TOL, f"prompt {i}: log-probabilities differ by {worst}"


@pytest.fixture(scope="module")
def saved(vllm, sglang, daemon) -> dict[str, Any]:
    """Each engine's plain prefill of the other's prompts, then A saved by vLLM and B by SGLang."""
    refs = {"vllm_b": vllm.generate(B, 6, salts=["plain-vllm"] * len(B)),
            "sglang_a": sglang_generate(sglang, A, cache_salt="plain-sglang"),
            "vllm_a": vllm.generate(A, 6)}
    refs["sglang_b"] = sglang_generate(sglang, B)
    assert [o["cached"] for o in refs["sglang_a"] + refs["sglang_b"]] == [0] * 4
    # the plain runs saved under their salts too: 4 prompts of each engine, CHUNKS chunks each
    assert wait_for(lambda: sglang_real.stored(daemon) >= 8 * CHUNKS, timeout=120), sglang_real.stored(daemon)
    return refs


def test_vllm_loads_what_sglang_saved(vllm, saved):
    vllm.reset_prefix_cache()
    before = vllm.stats()
    out = vllm.generate(B, 6)
    assert_same(out, saved["vllm_b"])
    assert vllm_real.delta(vllm.stats(), before, "worker", "chunks_loaded") == CHUNKS * len(B)


def test_sglang_loads_what_vllm_saved(sglang, saved):
    sglang.flush_cache()
    out = sglang_generate(sglang, A)
    assert_same(out, saved["sglang_a"])
    assert [o["from_storage"] for o in out] == [CHUNKS * CHUNK] * len(A)


def test_a_cache_salt_seeds_both_engines_alike(sglang, saved):
    """vLLM's plain run of B under a salt saved it so; SGLang asked under the same salt loads it."""
    sglang.flush_cache()
    out = sglang_generate(sglang, B[:1], cache_salt="plain-vllm")
    assert out[0]["from_storage"] == CHUNKS * CHUNK
    assert_same(out, saved["sglang_b"][:1])


def test_transformers_loads_what_vllm_saved(model, daemon, saved):
    """A's first prompt in transformers, from the chunks vLLM saved, against transformers' plain prefill."""
    pytest.importorskip("transformers")
    import torch
    from transformers import LlamaForCausalLM

    from kvstore.connectors.hf import load_prefix
    from harness.engines.tiny import greedy, prefill

    torch.manual_seed(0)
    m = LlamaForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ids = torch.tensor([A[0]])
    logits, cache = prefill(m, ids)
    want = greedy(m, logits, cache, 6)
    want_lp = torch.log_softmax(logits[0, -1].double(), -1)[want[0]].item()
    with canonical.connect(daemon.address, model, chunk_tokens=CHUNK) as client:
        cache, n = load_prefix(client, m, ids, checkpoint=model)
    assert n == CHUNKS * CHUNK, n
    logits, cache = prefill(m, ids, cache, start=n)
    got = greedy(m, logits, cache, 6)
    got_lp = torch.log_softmax(logits[0, -1].double(), -1)[got[0]].item()
    assert got == want, (got, want)
    assert abs(got_lp - want_lp) <= TOL, (got_lp, want_lp)


# -- tensor parallelism: vLLM at TP=2 (two worker processes, gloo), each rank its KV head --------------------

C = vllm_real.prompts(2, LENGTH, seed=103)    # saved by vLLM at TP=2


@pytest.fixture(scope="module")
def vllm_tp2(workdir, model, daemon, saved) -> Iterator[vllm_real.EngineProc]:
    pool = vllm_real.EnginePool()
    pool.use_workdir(workdir)
    pool.use_model(model)
    # vLLM binds each CPU worker's threads to a NUMA node of its own unless told which cores: one core each
    yield pool.get("tp2", connector=pool.connector(), max_model_len=4096, tp=2,
                   env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    pool.keep()


def hit_tokens(engine: vllm_real.EngineProc, batch: list[list[int]], **kw: Any) -> tuple[list[dict], int]:
    """Outputs of `batch` after vLLM forgot its own cache, and the prompt tokens its scheduler loaded."""
    engine.reset_prefix_cache()
    before = engine.stats()
    out = engine.generate(batch, 6, **kw)
    return out, vllm_real.delta(engine.stats(), before, "scheduler", "hit_tokens")


def test_tp2_loads_what_tp1_engines_saved(vllm_tp2, saved):
    """Each rank reads its head out of the whole chunks vLLM (A) and SGLang (B) saved at TP=1."""
    for batch in (A, B):
        want, hits = hit_tokens(vllm_tp2, batch, salts=["plain-tp2"] * len(batch))
        assert hits == 0
        out, hits = hit_tokens(vllm_tp2, batch)
        assert_same(out, want)
        assert hits == CHUNKS * CHUNK * len(batch)


def tp1_engines_load_what(save: Any, batch: list[list[int]], vllm: vllm_real.EngineProc,
                          sglang: sglang_real.SGLangServer, daemon: Any) -> None:
    """vLLM and SGLang at TP=1 read every head of `batch` from the slices a TP=2 engine's two ranks saved when
    `save(batch)` ran."""
    held = sglang_real.stored(daemon)
    want_vllm = vllm.generate(batch, 6, salts=["plain-vllm"] * len(batch))
    want_sglang = sglang_generate(sglang, batch, cache_salt="plain-sglang")
    before = held + 2 * CHUNKS * len(batch)             # the plain runs' chunks, saved under their salts
    assert wait_for(lambda: sglang_real.stored(daemon) >= before, timeout=120)
    save(batch)
    assert wait_for(lambda: sglang_real.stored(daemon) >= before + 2 * CHUNKS * len(batch), timeout=120)
    vllm.reset_prefix_cache()
    moved = vllm.stats()
    assert_same(vllm.generate(batch, 6), want_vllm)
    assert vllm_real.delta(vllm.stats(), moved, "worker", "chunks_loaded") == CHUNKS * len(batch)
    sglang.flush_cache()
    out = sglang_generate(sglang, batch)
    assert_same(out, want_sglang)
    assert [o["from_storage"] for o in out] == [CHUNKS * CHUNK] * len(batch)


def test_tp1_engines_load_what_tp2_saved(vllm_tp2, vllm, sglang, daemon, saved):
    tp1_engines_load_what(lambda batch: vllm_tp2.generate(batch, 6), C, vllm, sglang, daemon)


# -- SGLang at TP=2 (two scheduler processes, gloo: harness/engines/sglang_cpu_shim keeps NCCL out) ----------

D = vllm_real.prompts(2, LENGTH, seed=104)    # saved by SGLang at TP=2


@pytest.fixture(scope="module")
def sglang_tp2(workdir, model, daemon, saved) -> Iterator[sglang_real.SGLangServer]:
    flags = sglang_real.hicache_flags(daemon.address, reset_on_flush=False)
    # SGLang binds each CPU rank's threads to a NUMA node of its own unless told which cores: one core each
    server = sglang_real.SGLangServer(sglang_real.require_engine(), model,
                                      ["--page-size", str(CHUNK), "--tp", "2", *flags], workdir, "tp2",
                                      env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"})
    yield server
    server.close()


def test_sglang_tp2_loads_what_tp1_engines_saved(sglang_tp2, saved):
    """Each rank reads its head out of the whole chunks vLLM (A) and SGLang (B) saved at TP=1."""
    for batch in (A, B):
        want = sglang_generate(sglang_tp2, batch, cache_salt="plain-sglang-tp2")
        assert [o["cached"] for o in want] == [0] * len(batch)
        sglang_tp2.flush_cache()
        out = sglang_generate(sglang_tp2, batch)
        assert_same(out, want)
        assert [o["from_storage"] for o in out] == [CHUNKS * CHUNK] * len(batch)


def test_tp1_engines_load_what_sglang_tp2_saved(sglang_tp2, vllm, sglang, daemon, saved):
    tp1_engines_load_what(lambda batch: sglang_generate(sglang_tp2, batch), D, vllm, sglang, daemon)
