"""A full host tier says what holds the room, with its bytes (issue 24, item 9).

A put larger than the whole tier, a put that meets the writer's own open reservation, one that meets another
writer's, and one that meets leased chunks each get a StoreFullError that names its case and the bytes of it,
on a real daemon with a 4 MiB host tier and no disk tier (nothing can leave DRAM).
"""

from __future__ import annotations

import os
import re

import pytest

import kvstore

MiB = 1 << 20
CHUNK = 1_000_000


@pytest.fixture
def daemon(start_daemon):
    return start_daemon("--host-mem", "4MiB", "--disk-size", "0")


def _keys(n: int) -> list[bytes]:
    return [os.urandom(16) for _ in range(n)]


def _bytes_of(message: str, holder: str) -> int:
    found = re.search(rf"(\d+) (?:held )?by {holder}", message)
    assert found, message
    return int(found[1])


def test_a_put_larger_than_the_whole_tier_says_so(daemon):
    with daemon.client() as c, pytest.raises(kvstore.StoreFullError) as err:
        c.put(_keys(10), [b"x" * 500_000] * 10)
    assert "it asks for 5000000 bytes" in str(err.value) and "the whole host tier holds 4194304 bytes" in str(err.value)
    assert "smaller batches" in str(err.value) and "--host-mem" in str(err.value)


def test_room_held_by_the_writers_own_reservation_is_named_as_its_own(daemon):
    with daemon.client() as c:
        held = c.reserve(_keys(3), [CHUNK] * 3)
        with pytest.raises(kvstore.StoreFullError) as err:
            c.put(_keys(3), [b"x" * CHUNK] * 3)
        held.abort()
    message = str(err.value)
    assert _bytes_of(message, "this writer's open reservations") >= 3 * CHUNK, message
    assert "other writers" not in message and "leases" not in message
    assert "commit or abort this client's open reservations" in message


def test_room_held_by_another_writers_reservation_is_named_as_theirs(daemon):
    with daemon.client() as owner, daemon.client() as other:
        held = owner.reserve(_keys(3), [CHUNK] * 3)
        with pytest.raises(kvstore.StoreFullError) as err:
            other.put(_keys(3), [b"x" * CHUNK] * 3)
        held.abort()
    message = str(err.value)
    assert _bytes_of(message, "other writers' open reservations") >= 3 * CHUNK, message
    assert "this writer's" not in message and "retry once the other writers commit" in message


def test_room_held_by_leases_is_named_with_its_bytes(daemon):
    with daemon.client() as c, daemon.client() as other:
        keys = _keys(3)
        c.put(keys, [b"y" * CHUNK] * 3)
        with c.get(keys):
            with pytest.raises(kvstore.StoreFullError) as err:
                other.put(_keys(2), [b"x" * CHUNK] * 2)
    message = str(err.value)
    assert _bytes_of(message, "leases") >= 3 * CHUNK, message
    assert "reservations" not in message and "release leases sooner" in message
