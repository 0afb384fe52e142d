"""Reading back what workers had acknowledged before a daemon was killed
(tests/server/test_faults.py, bench/soak.py)."""

from __future__ import annotations

import os

import kvstore

from .workload import CHUNK_TOKENS, NAMESPACE, payload_ok


def read_back(address: str, keys: list[bytes]) -> tuple[int, int, int]:
    """(correct, corrupt, missing) over ``keys``, read one by one with a fresh client."""
    correct = corrupt = missing = 0
    with kvstore.connect(address, namespace=NAMESPACE, chunk_tokens=CHUNK_TOKENS, timeout=10) as c:
        for key in keys:
            with c.get([key]) as views:
                if not views:
                    missing += 1
                elif payload_ok(key, views[0]):
                    correct += 1
                else:
                    corrupt += 1
    return correct, corrupt, missing


def acked_keys(paths: list[str]) -> list[bytes]:
    keys: list[bytes] = []
    for path in paths:
        if os.path.exists(path):
            with open(path) as f:
                keys += [bytes.fromhex(line) for line in f.read().split() if len(line) == 32]
    return list(dict.fromkeys(keys))
