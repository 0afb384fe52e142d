"""Chained chunk keys.

``key_i = H(key_{i-1} ‖ tokens_i ‖ extras_i)`` with ``key_{-1} = H(namespace)``; ``extras_i`` is what a connector
folds into chunk i beyond its token ids (the hashes of the images whose placeholder the chunk holds, its prompt
embeddings...): empty for a chunk of plain tokens, whose key is then ``H(key_{i-1} ‖ tokens_i)``. H is xxh3-128:
stable across processes, machines and Python versions (never Python's ``hash()``, whose seed differs per process).
Because every key commits to its whole prefix, "how much of this prompt is cached" is a walk over a flat map that
stops at the first miss. Tokens are hashed as little-endian int64 so that the same ids give the same key whatever
integer type the caller holds them in.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import xxhash

from .errors import UsageError

KEY_BYTES = 16
KEY_SCHEME = "xxh3-128/int64le/v1"


def namespace_root(namespace: str) -> bytes:
    """The chain's root key: H(namespace)."""
    return xxhash.xxh3_128_digest(("kvstore:" + KEY_SCHEME + ":" + namespace).encode())


ONE_SEQUENCE = ("one sequence of integer token ids: a list, a 1-D array or tensor, or a 2-D one with a single "
                "row (such as transformers' 1 x T input_ids)")
INT64 = np.iinfo(np.int64)


def _as_int64_bytes(token_ids: object) -> bytes:
    """The token ids as little-endian int64 bytes; a UsageError for anything but one sequence of integers that
    int64 holds (a batch of rows, nested lists, floats, strings, None, generators)."""
    if isinstance(token_ids, (str, bytes, bytearray, memoryview)) or token_ids is None:
        raise UsageError(f"token_ids must be {ONE_SEQUENCE}; got {type(token_ids).__name__}")
    if hasattr(token_ids, "detach"):  # a torch tensor; converted without importing torch here
        dtype = getattr(token_ids, "dtype", "?")
        try:
            token_ids = token_ids.detach().cpu().numpy()
        except TypeError as exc:   # a dtype numpy lacks (bfloat16): not token ids either way
            raise UsageError(f"token_ids must be integers that int64 holds; got a tensor of {dtype}") from exc
    try:
        arr = np.asarray(token_ids)
    except ValueError as exc:   # ragged nesting
        raise UsageError(f"token_ids must be {ONE_SEQUENCE}; got nested sequences of unequal lengths") from exc
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1:
        got = "a single value or an iterator" if arr.ndim == 0 else f"shape {tuple(arr.shape)}"
        hint = ": pass one row at a time" if arr.ndim == 2 else ""
        raise UsageError(f"token_ids must be {ONE_SEQUENCE}; got {got}{hint}")
    if arr.size and (arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer)):
        what = "integers beyond int64" if arr.dtype == object else f"dtype {arr.dtype}"
        raise UsageError(f"token_ids must be integers that int64 holds; got {what}")
    if arr.dtype == np.uint64 and arr.size and arr.max() > INT64.max:
        raise UsageError("token_ids must be integers that int64 holds; got values above 2**63 - 1")
    return arr.astype("<i8", copy=False).tobytes()


def chunk_keys(namespace: str, token_ids: Sequence[int] | object, chunk_tokens: int,
               include_partial: bool = False, extras: Sequence[bytes] = ()) -> list[bytes]:
    """One key per full chunk of ``token_ids`` (plus the short tail if ``include_partial``).

    ``token_ids``: one sequence (see ``ONE_SEQUENCE``); ``extras``: per chunk, bytes folded into its key after
    its tokens (chunks past the end of ``extras``, and empty entries, fold nothing). Raises UsageError for
    anything else, or a ``chunk_tokens`` that is not a positive integer."""
    if type(chunk_tokens) is not int or chunk_tokens <= 0:
        raise UsageError(f"chunk_tokens must be a positive integer, got {chunk_tokens!r}")
    raw = _as_int64_bytes(token_ids)
    n_tokens = len(raw) // 8
    n_full = n_tokens // chunk_tokens
    ends = [(i + 1) * chunk_tokens for i in range(n_full)]
    if include_partial and n_tokens % chunk_tokens:
        ends.append(n_tokens)
    keys: list[bytes] = []
    prev = namespace_root(namespace)
    start = 0
    for i, end in enumerate(ends):
        h = xxhash.xxh3_128()
        h.update(prev)
        h.update(raw[start * 8:end * 8])
        extra = extras[i] if i < len(extras) else b""
        if extra:   # its length after it: a short tail's tokens and extras never read as another split
            h.update(extra)
            h.update(len(extra).to_bytes(8, "little"))
        prev = h.digest()
        keys.append(prev)
        start = end
    return keys
