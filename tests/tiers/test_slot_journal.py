"""The journal of committed slots a crash leaves (``kvstore/tiers/host/journal.py``): what a replay proves."""

from __future__ import annotations

import os

import pytest

from kvstore.tiers.host import journal as journal_mod
from kvstore.tiers.host.description import KeptChunk
from kvstore.tiers.host.journal import JournalError, SlotJournal, read_journal, read_journal_socket

SOCKET = "/tmp/kvs-test/kv.sock"


def chunk(n: int, offset: int, size: int = 4096) -> KeptChunk:
    return KeptChunk(n.to_bytes(16, "little"), offset, size, "ns", None, 1000 + n)


def test_a_replay_lists_the_committed_slots_not_freed_in_commit_order(tmp_path):
    j = SlotJournal.create(str(tmp_path / "j"), SOCKET)
    j.committed([chunk(1, 0), chunk(2, 4096), chunk(3, 8192)])
    j.freed(4096)
    j.flush()
    replay = read_journal(j.path)
    assert replay is not None and replay.socket == SOCKET and not replay.torn
    assert [c.key for c in replay.chunks] == [chunk(1, 0).key, chunk(3, 8192).key]
    assert read_journal_socket(j.path) == SOCKET


def test_a_free_is_written_before_the_next_commit_and_a_reused_slot_names_only_its_new_chunk(tmp_path):
    j = SlotJournal.create(str(tmp_path / "j"), SOCKET)
    j.committed([chunk(1, 0)])
    j.freed(0)
    j.committed([chunk(2, 0)])   # a new chunk of the same size in the same slot
    assert [c.key for c in read_journal(j.path).chunks] == [chunk(2, 0).key]


def test_a_torn_last_record_ends_the_replay_and_the_freed_slot_stays_free(tmp_path):
    j = SlotJournal.create(str(tmp_path / "j"), SOCKET)
    j.committed([chunk(1, 0)])
    j.freed(0)
    j.flush()
    whole = os.path.getsize(j.path)
    j.committed([chunk(2, 0)])
    os.truncate(j.path, whole + 20)   # the death came inside the new chunk's COMMIT
    replay = read_journal(j.path)
    assert replay.torn and replay.chunks == []


def test_pending_frees_are_not_on_file_until_flushed(tmp_path):
    j = SlotJournal.create(str(tmp_path / "j"), SOCKET)
    j.committed([chunk(1, 0)])
    j.freed(0)
    assert len(read_journal(j.path).chunks) == 1
    j.flush()
    assert read_journal(j.path).chunks == []


def test_compaction_keeps_the_live_commits_only(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "COMPACT_SLACK", 0)
    j = SlotJournal.create(str(tmp_path / "j"), SOCKET)
    for n in range(50):
        j.committed([chunk(n, n * 4096)])
        if n % 10:
            j.freed(n * 4096)   # nine in ten freed: the file soon holds far more than what is live
    j.flush()
    assert j.compactions > 0
    assert os.path.getsize(j.path) <= journal_mod.COMPACT_FACTOR * j.live_bytes + 64
    assert [c.offset for c in read_journal(j.path).chunks] == [n * 4096 for n in range(0, 50, 10)]


def test_a_failed_write_removes_the_journal_so_a_crash_adopts_nothing(tmp_path, monkeypatch):
    j = SlotJournal.create(str(tmp_path / "j"), SOCKET)
    j.committed([chunk(1, 0)])

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_mod, "_write_all", full)
    j.freed(0)
    j.flush()
    assert not j.on and not os.path.exists(j.path)
    j.committed([chunk(2, 0)])   # off: nothing more is written or raised


@pytest.mark.parametrize("damage, message", [(b"NOTAJRNL", "not a kvstore journal"),
                                             (b"KVSJRNL\0\x09\0\0\0", "format version 9")])
def test_a_journal_of_another_kind_is_refused_in_one_line(tmp_path, damage, message):
    j = SlotJournal.create(str(tmp_path / "j"), SOCKET)
    j.committed([chunk(1, 0)])
    with open(j.path, "r+b") as f:
        f.write(damage)
    with pytest.raises(JournalError, match=message):
        read_journal(j.path)


def test_a_forgotten_chunk_is_on_file_at_once(tmp_path):
    j = SlotJournal.create(str(tmp_path / "j"), SOCKET)
    j.committed([chunk(1, 0), chunk(2, 4096)])
    j.forget(0)   # deleted while a reader holds its slot: a crash now must not bring it back
    assert [c.offset for c in read_journal(j.path).chunks] == [4096]


def test_removing_a_journal_removes_an_interrupted_rewrite_too(tmp_path):
    path = str(tmp_path / "j")
    SlotJournal.create(path, SOCKET)
    with open(path + ".4242.tmp", "wb") as f:
        f.write(b"half")
    journal_mod.remove_journal(path)
    assert os.listdir(tmp_path) == []
