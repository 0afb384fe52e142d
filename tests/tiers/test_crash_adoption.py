"""Crash adoption with real daemons: after SIGKILL the next daemon adopts what the killed one's journal proves
(committed chunks whose checksum still matches) and nothing else (``kvstore/tiers/host/journal.py``)."""

from __future__ import annotations

import os
import signal
import subprocess

from conftest import wait_for
from kvstore.mapped.arena import arena_path_for
from kvstore.tiers.host.journal import journal_path_for
from harness.crashes import acked_keys, read_back
from harness.daemons import run_cli
from support.scribble import damage
from harness.workload import worker_command
from test_warm_restart import CHUNK, NO_DISK, adoption_done, fill, served


def summed(daemon, chunks: int) -> None:
    """Wait until the daemon took the checksums of ``chunks`` commits (a chunk is journaled once it has one)."""
    with daemon.client() as c:
        assert wait_for(lambda: c.stats()["integrity"]["sums"] >= chunks, timeout=30)


def test_a_killed_daemon_s_committed_chunks_are_adopted_byte_for_byte(start_daemon):
    d = start_daemon(*NO_DISK)
    with d.client() as c:
        keys, payloads = fill(c, prompts=6, chunks=8)
    summed(d, 6 * 8)
    arena = arena_path_for(d.socket_path)
    assert os.path.exists(journal_path_for(arena))
    d.stop(signal.SIGKILL)
    d.start()
    report = adoption_done(d)
    assert report["source"] == "journal" and report["adopted_chunks"] == 6 * 8 and report["corrupt_chunks"] == 0
    with d.client() as c:
        for k, p in zip(keys, payloads):
            assert served(c, k) == p
    assert "event=arena_journal" in d.log() and "adoption_source=journal" in d.log()
    table = run_cli("stats", "--socket", d.socket_path, env={"COLUMNS": "200"}).stdout
    assert "warm restart" in table and "from the journal" in table and "48 adopted" in table


def test_slots_freed_and_reused_before_the_kill_are_adopted_only_with_their_latest_chunk(start_daemon):
    d = start_daemon("--adopt", "--disk-size", "0", "--host-mem", "8MiB")
    with d.client() as c:
        keys, payloads = fill(c, prompts=12, chunks=4)   # 12 MiB through 8 MiB: the oldest slots are reused
        summed(d, 12 * 4)
        held = [i for i, k in enumerate(keys) if c.lookup(k) == len(k)]
    assert 0 < len(held) < 12
    d.stop(signal.SIGKILL)
    d.start()
    report = adoption_done(d)
    assert report["corrupt_chunks"] == 0 and report["adopted_chunks"] == 4 * len(held)
    with d.client() as c:
        for i, (k, p) in enumerate(zip(keys, payloads)):
            assert served(c, k) == (p if i in held else [])


def test_a_scribbled_slot_of_a_killed_daemon_is_dropped_not_served(start_daemon):
    d = start_daemon(*NO_DISK)
    with d.client() as c:
        keys, payloads = fill(c, prompts=2, chunks=4)
    summed(d, 8)
    d.stop(signal.SIGKILL)
    damage(arena_path_for(d.socket_path), [payloads[1][1]])
    d.start()
    report = adoption_done(d)
    assert report["corrupt_chunks"] == 1 and report["dropped_chunks"] == 2
    with d.client() as c:
        assert served(c, keys[0]) == payloads[0] and served(c, keys[1]) == payloads[1][:1]


def test_a_reservation_being_written_at_the_kill_never_survives(start_daemon):
    d = start_daemon(*NO_DISK)
    with d.client() as c:
        keys, payloads = fill(c, prompts=1, chunks=4)
        half = c.chunk_keys(range(10_000_000, 10_000_000 + 256 * 4))
        res = c.reserve(half, [CHUNK] * 4)
        for view in res.views[:2]:
            view[:] = os.urandom(CHUNK)   # two of four written, never committed
        summed(d, 4)
        d.stop(signal.SIGKILL)
    d.start()
    report = adoption_done(d)
    assert report["adopted_chunks"] == 4
    with d.client() as c:
        assert c.lookup(half) == 0 and served(c, keys[0]) == payloads[0]


def test_sigkill_during_a_stream_of_puts_adopts_only_exact_committed_chunks(start_daemon):
    d = start_daemon("--adopt", "--disk-size", "0", "--host-mem", "32MiB")
    acked = [os.path.join(d.workdir, f"acked{i}") for i in range(2)]
    workers = [subprocess.Popen(worker_command(d.address, 60, seed=i, tolerate_outage=True, acked_path=acked[i],
                                               timeout=1, max_chunks=12),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    try:
        assert wait_for(lambda: len(acked_keys(acked)) > 300, timeout=60)
        seen = len(acked_keys(acked))
        assert wait_for(lambda: len(acked_keys(acked)) > seen, timeout=60)   # the stream is still flowing
        d.stop(signal.SIGKILL)   # mid-stream: puts being written, committed, summed
    finally:
        for w in workers:
            w.kill()
            w.wait()
    before = acked_keys(acked)
    d.start()
    report = adoption_done(d)
    assert report["source"] == "journal" and report["adopted_chunks"] > 0 and report["corrupt_chunks"] == 0
    correct, corrupt, _missing = read_back(d.address, before)
    assert corrupt == 0 and correct > 0
    with d.client() as c:   # nothing but what was adopted: no reservation or half-written put came back
        assert c.stats()["tiers"]["host"]["chunks"] == report["adopted_chunks"]


def test_a_chunk_deleted_before_the_kill_does_not_come_back(start_daemon):
    d = start_daemon(*NO_DISK)
    with d.client() as c:
        keys, payloads = fill(c, prompts=2, chunks=4)
        summed(d, 8)
        assert c.delete(keys[0]) == 4
    d.stop(signal.SIGKILL)
    d.start()
    assert adoption_done(d)["adopted_chunks"] == 4
    with d.client() as c:
        assert c.lookup(keys[0]) == 0 and served(c, keys[1]) == payloads[1]


def test_kvstore_clean_frees_what_a_killed_daemon_left_when_no_start_will_come(start_daemon):
    d = start_daemon(*NO_DISK)
    with d.client() as c:
        fill(c, prompts=1, chunks=2)
    summed(d, 2)
    d.stop(signal.SIGKILL)
    arena = arena_path_for(d.socket_path)
    assert os.path.exists(arena) and os.path.exists(journal_path_for(arena))
    assert run_cli("clean", "--socket", d.socket_path).returncode == 0
    assert not os.path.exists(arena) and not os.path.exists(journal_path_for(arena))
