"""Chained chunk keys.

``key_i = H(key_{i-1} ‖ tokens_i)`` with ``key_{-1} = H(namespace)``. H is xxh3-128: stable across processes,
machines and Python versions (never Python's ``hash()``, whose seed differs per process). Because every key
commits to its whole prefix, "how much of this prompt is cached" is a walk over a flat map that stops at the
first miss. Tokens are hashed as little-endian int64 so that the same ids give the same key whatever integer
type the caller holds them in.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import xxhash

KEY_BYTES = 16
KEY_SCHEME = "xxh3-128/int64le/v1"


def namespace_root(namespace: str) -> bytes:
    """The chain's root key: H(namespace)."""
    return xxhash.xxh3_128_digest(("kvstore:" + KEY_SCHEME + ":" + namespace).encode())


def _as_int64_bytes(token_ids: object) -> bytes:
    if hasattr(token_ids, "detach"):  # a torch tensor; converted without importing torch here
        token_ids = token_ids.detach().cpu().reshape(-1).numpy()
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"token ids must be integers, got dtype {arr.dtype}")
    return arr.astype("<i8", copy=False).tobytes()


def chunk_keys(namespace: str, token_ids: Sequence[int] | object, chunk_tokens: int,
               include_partial: bool = False) -> list[bytes]:
    """One key per full chunk of ``token_ids`` (plus the short tail if ``include_partial``)."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    raw = _as_int64_bytes(token_ids)
    n_tokens = len(raw) // 8
    n_full = n_tokens // chunk_tokens
    ends = [(i + 1) * chunk_tokens for i in range(n_full)]
    if include_partial and n_tokens % chunk_tokens:
        ends.append(n_tokens)
    keys: list[bytes] = []
    prev = namespace_root(namespace)
    start = 0
    for end in ends:
        h = xxhash.xxh3_128()
        h.update(prev)
        h.update(raw[start * 8:end * 8])
        prev = h.digest()
        keys.append(prev)
        start = end
    return keys
