"""Copying a batch of chunks between the caller's buffers and the arena: on two threads once the batch is large.

One core's copy does not fill the memory bus: it stalls on its own cache misses (a copy into arena memory that
is not in cache reads each line before writing it), so a second thread copying the other half of a large batch
gets more of the bus; a small batch gains nothing, since handing half of it to a thread costs more than it saves
(``bench/copies.py`` measures both against a memcpy of the same bytes). So a batch of ``PARALLEL_FROM``
bytes or more, of two chunks or more, is cut in two halves by bytes at a chunk boundary: the calling thread copies
the first, one helper thread the second, and the call returns when both are done (the first error raised, if
any, after both). numpy's and torch's copies release the GIL (``buffers.py`` copies host buffers through numpy
for that), so the halves run at once. The helper thread is started at the first large batch and lives as
long as the process; two threads of a client copying large batches at once share it (one half waits for the
other's).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

PARALLEL_FROM = 8 << 20   # a batch of at least this many bytes is copied by two threads

_helper: ThreadPoolExecutor | None = None
_helper_lock = threading.Lock()


def copy_batch(copy: Callable[..., None], pairs: Sequence[tuple[Any, Any]], sizes: Sequence[int]) -> None:
    """``copy(destination, source)`` for each pair (one per chunk, ``sizes`` its bytes): in order on this thread
    for a small batch, else split in two halves, one of them on the helper thread (``copy`` is then called with
    ``gil_free=True``)."""
    total = sum(sizes)
    if total < PARALLEL_FROM or len(pairs) < 2:
        for dst, src in pairs:
            copy(dst, src)
        return
    cut = _half_by_bytes(sizes, total)
    other = _helper_pool().submit(_run, copy, pairs[cut:])
    try:
        _run(copy, pairs[:cut])
    except BaseException:
        other.exception()   # never return while the helper still writes into the caller's buffers
        raise
    error = other.exception()
    if error is not None:
        raise error


def _half_by_bytes(sizes: Sequence[int], total: int) -> int:
    """The first chunk of the second half: the cut nearest to half the bytes (never an empty half)."""
    at = 0
    for i, size in enumerate(sizes):
        if at + size / 2 >= total / 2:
            return min(max(i, 1), len(sizes) - 1)
        at += size
    return len(sizes) - 1


def _run(copy: Callable[..., None], pairs: Sequence[tuple[Any, Any]]) -> None:
    for dst, src in pairs:
        copy(dst, src, gil_free=True)


def _helper_pool() -> ThreadPoolExecutor:
    global _helper
    with _helper_lock:
        if _helper is None:
            _helper = ThreadPoolExecutor(1, thread_name_prefix="kvstore-copy")
        return _helper
