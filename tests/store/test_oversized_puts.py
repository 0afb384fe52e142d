"""A put larger than the whole host tier is refused before anything leaves DRAM (issue 40, item 2).

Such a put can never fit, so the daemon refuses it up front: nothing stored is evicted (nor, with a disk tier,
moved down to disk), and the message names the bytes the put asked for, the tier's capacity and the fixes. Each
put path is tried on a real daemon with a 16 MiB host tier holding ten 1 MiB chunks: a put from a mapped arena
(credit, then reserve), an inline put (over the stream, as a client without the arena sends it), a reserve, and
a queued put (``wait=False``).
"""

from __future__ import annotations

import os
from typing import Callable

import pytest

import kvstore

MiB = 1 << 20
HOST = 16 * MiB
STORED = 10
ASKED = 4 * 5 * MiB   # four 5 MiB chunks: 20 MiB, more than the 16 MiB tier


def _keys(n: int) -> list[bytes]:
    return [os.urandom(16) for _ in range(n)]


def _put_in_arena(c: kvstore.Client, keys: list[bytes]) -> None:
    c.put(keys, [bytes(5 * MiB)] * len(keys))


def _reserve(c: kvstore.Client, keys: list[bytes]) -> None:
    c.reserve(keys, [5 * MiB] * len(keys)).abort()


def _queued_put(c: kvstore.Client, keys: list[bytes]) -> None:
    c.put(keys, [bytes(5 * MiB)] * len(keys), wait=False)
    c.flush()


PATHS: dict[str, tuple[Callable[[kvstore.Client, list[bytes]], None], dict[str, bool]]] = {
    "arena put": (_put_in_arena, {}),
    "arena put without credits": (_put_in_arena, {"credits": False}),
    "inline put": (_put_in_arena, {"use_arena": False}),
    "reserve": (_reserve, {}),
    "queued put": (_queued_put, {}),
}


@pytest.mark.parametrize("disk", ["0", "64MiB"], ids=["dram only", "with a disk tier"])
@pytest.mark.parametrize("path", list(PATHS))
def test_a_put_larger_than_the_host_tier_evicts_nothing(start_daemon, path: str, disk: str) -> None:
    daemon = start_daemon("--host-mem", "16MiB", "--disk-size", disk)
    call, options = PATHS[path]
    stored = _keys(STORED)
    with daemon.client() as c:
        c.put(stored, [os.urandom(MiB) for _ in stored])
        with daemon.client(**options) as writer, pytest.raises(kvstore.StoreFullError) as err:
            call(writer, _keys(4))
        found = c.lookup_tiers(stored)
        stats = c.stats()
    assert found.count == STORED and found.tiers.get("host") == STORED, found
    moved = {k: stats["counters"][k] for k in ("evictions", "demotions_host_disk")}
    assert moved == {"evictions": 0, "demotions_host_disk": 0}, moved
    message = str(err.value)
    assert f"asks for {ASKED} bytes" in message, message
    assert f"the whole host tier holds {HOST} bytes" in message, message
    assert "--host-mem" in message and "smaller batches" in message, message
