"""Retention classes survive a restart with real daemons: a clean stop's kept arena, a killed daemon's journal and
the disk tier's files each bring chunks back in their class, so after the restart a flood still takes the lower
classes first."""

from __future__ import annotations

import os
import signal

from conftest import wait_for

import kvstore

CHUNK = 1_000_000
ADOPT = ("--adopt", "--disk-size", "0", "--host-mem", "16MiB")


def _keys(n: int) -> list[bytes]:
    return [os.urandom(16) for _ in range(n)]


def _held(client: kvstore.Client, keys: list[bytes]) -> list[bool]:
    return [client.lookup([k]) == 1 for k in keys]


def _put(client: kvstore.Client, keys: list[bytes], retention: str = "normal") -> None:
    for key in keys:
        assert client.put([key], [os.urandom(CHUNK)], retention=retention) == 1


def _flood(client: kvstore.Client, chunks: int) -> None:
    for _ in range(chunks):
        client.put(_keys(1), [b"f" * CHUNK])


def _adopted(daemon, chunks: int) -> None:
    with daemon.client() as c:
        assert wait_for(lambda: c.stats()["adoption"]["state"] == "done", timeout=30)
        assert c.stats()["adoption"]["adopted_chunks"] == chunks


def _fill_dram(daemon) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """Low chunks first (the oldest), then high, then normal ones: 9 of the 16 MiB tier. The high ones are in the
    middle, so that a restart that lost the classes loses some of them whichever end its order starts from."""
    high, normal, low = _keys(3), _keys(3), _keys(3)
    with daemon.client() as c:
        _put(c, low, "low")
        _put(c, high, "high")
        _put(c, normal)
        assert wait_for(lambda: c.stats()["integrity"]["sums"] >= 9, timeout=30)   # journaled once summed
    return high, normal, low


def _check_order(daemon, high: list[bytes], normal: list[bytes], low: list[bytes]) -> None:
    with daemon.client() as c:
        _flood(c, 12)   # some 5 chunks must go: the 3 low ones, then normal ones, never a high one
        assert not any(_held(c, low)) and not all(_held(c, normal)) and all(_held(c, high))


def test_a_clean_stop_keeps_each_chunks_class(start_daemon):
    d = start_daemon(*ADOPT)
    high, normal, low = _fill_dram(d)
    assert d.stop() == 0
    d.start()
    _adopted(d, 9)
    _check_order(d, high, normal, low)


def test_a_killed_daemons_journal_keeps_each_chunks_class(start_daemon):
    d = start_daemon(*ADOPT)
    high, normal, low = _fill_dram(d)
    d.stop(signal.SIGKILL)
    d.start()
    _adopted(d, 9)
    _check_order(d, high, normal, low)


def test_disk_files_keep_their_class_and_the_disk_evicts_by_it(start_daemon):
    d = start_daemon("--no-adopt", "--disk-size", "12MiB", "--host-mem", "16MiB")
    high, low = _keys(3), _keys(3)
    with d.client() as c:
        _put(c, high, "high")
        _put(c, low, "low")
        assert wait_for(lambda: c.stats()["tiers"]["disk"]["chunks"] == 6, timeout=30)
    assert d.stop() == 0
    d.start()   # DRAM comes back empty: the six are on disk only, each in its file's class
    with d.client() as c:
        _flood(c, 12)   # the disk holds some 11 files: the low ones go first, then the flood's own oldest
        assert wait_for(lambda: _writes_done(c), timeout=30)
        assert all(_held(c, high)) and not any(_held(c, low))


def _writes_done(client: kvstore.Client) -> bool:
    disk = client.stats()["disk"]
    return disk["write_queue_chunks"] == 0 and disk["writes_in_flight"] == 0
