"""Chained chunk keys are stable, prefix-committing and namespace-separated."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from kvstore.keys import chunk_keys, namespace_root


def test_keys_are_stable_across_processes_and_hash_seeds():
    code = "from kvstore.keys import chunk_keys; print(chunk_keys('ns', list(range(600)), 256)[1].hex())"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("1", "2")}
    assert len(outs) == 1
    assert outs.pop().strip() == chunk_keys("ns", list(range(600)), 256)[1].hex()


def test_each_key_commits_to_its_prefix():
    a = chunk_keys("ns", list(range(1024)), 256)
    tokens = list(range(1024))
    tokens[5] = 99999
    b = chunk_keys("ns", tokens, 256)
    assert len(a) == 4 and all(x != y for x, y in zip(a, b))
    c = chunk_keys("ns", list(range(1024)) + [1, 2, 3], 256)
    assert c == a  # the short tail has no key unless asked for
    assert len(chunk_keys("ns", list(range(1024)) + [1], 256, include_partial=True)) == 5


def test_token_containers_agree():
    ids = list(range(700))
    ref = chunk_keys("ns", ids, 128)
    assert chunk_keys("ns", np.array(ids, dtype=np.int32), 128) == ref
    assert chunk_keys("ns", torch.tensor([ids]), 128) == ref


def test_namespace_roots_differ():
    assert namespace_root("a") != namespace_root("b")
    assert chunk_keys("a", list(range(256)), 256) != chunk_keys("b", list(range(256)), 256)


def test_client_keys_take_a_namespace_per_call(client):
    tokens = list(range(512))
    assert client.chunk_keys(tokens) == chunk_keys("test", tokens, 256)
    assert client.chunk_keys(tokens, namespace="other", chunk_tokens=128) == chunk_keys("other", tokens, 128)
