"""Warm restart with real daemons: a clean stop keeps the DRAM tier, the next daemon on the socket adopts what it
can prove (``kvstore/store/adoption.py``)."""

from __future__ import annotations

import os
import signal
import struct

import pytest

from conftest import wait_for
from kvstore.mapped.arena import arena_path_for
from kvstore.tiers.host.description import description_path_for
from kvstore.tiers.host.journal import journal_path_for
from support.scribble import damage

CHUNK = 256 << 10
NO_DISK = ("--adopt", "--disk-size", "0", "--host-mem", "256MiB")


def fill(client, prompts: int, chunks: int, seed: int = 0) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """``prompts`` prompts of ``chunks`` chunks each, with distinct random payloads; (keys, payloads) per prompt."""
    all_keys, all_payloads = [], []
    for p in range(prompts):
        keys = client.chunk_keys([seed * 1_000_003 + p * 100_000 + t for t in range(256 * chunks)])
        payloads = [os.urandom(CHUNK) for _ in keys]
        assert client.put(keys, payloads) == len(keys)
        all_keys.append(keys)
        all_payloads.append(payloads)
    return all_keys, all_payloads


def served(client, keys: list[bytes]) -> list[bytes]:
    with client.get(keys) as views:
        return [bytes(v) for v in views]


def adoption_done(daemon) -> dict:
    with daemon.client() as c:
        assert wait_for(lambda: c.stats()["adoption"]["state"] == "done", timeout=30)
        return c.stats()["adoption"]


def test_a_clean_stop_keeps_every_chunk_and_the_next_daemon_serves_them_byte_for_byte(start_daemon):
    d = start_daemon(*NO_DISK)
    with d.client() as c:
        keys, payloads = fill(c, prompts=8, chunks=16)   # 32 MiB, no disk tier: only DRAM can bring them back
    assert d.stop() == 0
    arena = arena_path_for(d.socket_path)
    assert os.path.exists(arena) and os.path.exists(description_path_for(arena))
    d.start()
    report = adoption_done(d)
    assert report["adopted_chunks"] == report["listed_chunks"] == 8 * 16 and report["corrupt_chunks"] == 0
    assert not os.path.exists(description_path_for(arena))   # consumed: it described the arena until now
    with d.client() as c:
        for k, p in zip(keys, payloads):
            assert served(c, k) == p
        assert c.stats()["tiers"]["host"]["chunks"] == 8 * 16
    assert "adoption=verifying adoption_source=description kept_chunks=128" in d.log()
    assert "event=arena_adopted" in d.log()


def test_scribbled_chunks_are_dropped_with_their_continuations_and_never_served(start_daemon):
    d = start_daemon(*NO_DISK)
    with d.client() as c:
        keys, payloads = fill(c, prompts=4, chunks=8)
    assert d.stop() == 0
    # another process flips bytes in prompt 1's third chunk and prompt 3's first, between the two daemons
    damage(arena_path_for(d.socket_path), [payloads[1][2], payloads[3][0]])
    d.start()
    report = adoption_done(d)
    assert report["corrupt_chunks"] == 2 and report["dropped_chunks"] == 5 + 7   # their continuations go too
    with d.client() as c:
        assert served(c, keys[0]) == payloads[0] and served(c, keys[2]) == payloads[2]
        assert served(c, keys[1]) == payloads[1][:2]    # the prefix before the damage stays
        assert served(c, keys[3]) == []
        assert c.stats()["integrity"]["corrupt_host"] == 2


def test_no_adopt_starts_empty_and_frees_the_kept_arena(start_daemon):
    d = start_daemon(*NO_DISK)
    with d.client() as c:
        keys, _ = fill(c, prompts=2, chunks=4)
    assert d.stop() == 0
    arena = arena_path_for(d.socket_path)
    kept_inode = os.stat(arena).st_ino
    d.args.append("--no-adopt")
    d.start()
    assert os.stat(arena).st_ino != kept_inode and not os.path.exists(description_path_for(arena))
    assert 'adoption=off adoption_reason=--no-adopt' in d.log()
    with d.client() as c:
        assert c.lookup(keys[0]) == 0 and c.stats()["adoption"]["adopted_chunks"] == 0


def test_a_smaller_host_tier_adopts_what_fits_and_a_larger_one_everything(start_daemon):
    d = start_daemon(*NO_DISK)
    with d.client() as c:
        keys, payloads = fill(c, prompts=12, chunks=8)   # 24 MiB from the start of the arena
    assert d.stop() == 0
    d.args = [a if a != "256MiB" else "16MiB" for a in d.args]
    d.start()
    report = adoption_done(d)
    assert 0 < report["adopted_chunks"] < 12 * 8 and report["unfit_chunks"] == 12 * 8 - report["adopted_chunks"]
    with d.client() as c:
        hits = [len(served(c, k)) for k in keys]
        for k, p, n in zip(keys, payloads, hits):
            assert served(c, k) == p[:n]
    assert d.stop() == 0
    d.args = [a if a != "16MiB" else "512MiB" for a in d.args]
    d.start()
    assert adoption_done(d)["adopted_chunks"] == sum(hits)


def test_a_description_of_another_format_version_is_refused_in_one_line_and_the_arena_freed(start_daemon):
    d = start_daemon(*NO_DISK)
    with d.client() as c:
        keys, _ = fill(c, prompts=1, chunks=4)
    assert d.stop() == 0
    desc = description_path_for(arena_path_for(d.socket_path))
    with open(desc, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<I", 99))
    d.start()
    assert "adoption=refused" in d.log() and "is format version 99; this kvstore reads versions 1 and 2" in d.log()
    with d.client() as c:
        assert c.lookup(keys[0]) == 0


def test_a_killed_daemon_leaves_no_description_and_no_journal_without_adopt_and_its_arena_is_freed(start_daemon):
    d = start_daemon("--no-adopt", "--disk-size", "0", "--host-mem", "256MiB")
    with d.client() as c:
        keys, _ = fill(c, prompts=1, chunks=4)
    arena = arena_path_for(d.socket_path)
    inode = os.stat(arena).st_ino
    assert not os.path.exists(journal_path_for(arena))   # --no-adopt: nothing is journaled
    d.stop(signal.SIGKILL)
    assert not os.path.exists(description_path_for(arena))
    d.args = [a if a != "--no-adopt" else "--adopt" for a in d.args]
    d.start()
    assert os.stat(arena).st_ino != inode
    assert "the last daemon did not stop cleanly and left no journal of its arena" in d.log()
    with d.client() as c:
        assert c.lookup(keys[0]) == 0


def test_a_chunk_with_a_disk_copy_gets_its_dram_copy_back(start_daemon):
    d = start_daemon("--adopt", "--host-mem", "64MiB")
    with d.client() as c:
        keys, payloads = fill(c, prompts=2, chunks=4)
        assert wait_for(lambda: c.stats()["tiers"]["disk"]["chunks"] == 8)
    assert d.stop() == 0
    d.start()
    assert adoption_done(d)["adopted_chunks"] == 8
    with d.client() as c:
        assert c.stats()["tiers"]["host"]["chunks"] == 8   # in DRAM again, not only on disk
        assert served(c, keys[1]) == payloads[1]


@pytest.mark.parametrize("flag", ["--adopt", "--no-adopt"])
def test_the_ready_line_says_what_was_adopted(start_daemon, flag):
    d = start_daemon(flag, "--disk-size", "0")
    assert "adoption=" in next(line for line in d.log().splitlines() if "event=ready" in line)


def test_a_credit_lent_before_the_restart_is_never_written_into_the_adopted_arena(start_daemon):
    d = start_daemon(*NO_DISK)
    writer = d.client()
    try:
        old_keys, old_payloads = fill(writer, prompts=2, chunks=4)   # the writer now holds a credit
        assert writer.held_credit is not None
        assert d.stop() == 0
        d.start()
        adoption_done(d)
        with d.client() as other:   # takes the free space after the adopted chunks: where the old credit lay
            new_keys, new_payloads = fill(other, prompts=4, chunks=4, seed=7)
        late_keys, late_payloads = fill(writer, prompts=1, chunks=4, seed=9)   # says hello again, puts anew
        with d.client() as reader:
            for k, p in zip(old_keys + new_keys + late_keys, old_payloads + new_payloads + late_payloads):
                assert served(reader, k) == p
    finally:
        writer.close()
