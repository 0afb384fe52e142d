"""A view from ``get`` never changes under its reader without the reader learning it (issue 14, item 4).

Two kinds of reader, each against a real daemon with ``--lease-ttl 1s`` whose arena is then overwritten many
times by another client:

- a local client whose process the daemon follows: its lease outlives the TTL while it lives, so the bytes under
  its views stay the chunk's bytes and leaving the block raises nothing;
- a client in another pid namespace (``unshare --pid``), whose process the daemon cannot follow: the TTL takes
  its lease back, and leaving the block raises ``LeaseError`` — the reader learns before it trusts the bytes.

In both, the reader's verdict is checked against the bytes themselves: "unchanged" or "told", never "changed
and trusted".
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import kvstore
from kvstore.store.handles import HandleTable
from conftest import wait_for

CHUNK = 1 << 20
TTL_ARGS = ("--lease-ttl", "1s", "--host-mem", "8MiB", "--disk-size", "0")


def overwrite_arena(client: kvstore.Client, rounds: int = 32) -> None:
    """Put ``rounds`` distinct chunks of fresh bytes: every unpinned slot of an 8 MiB arena is reused."""
    for i in range(rounds):
        keys = client.chunk_keys([10_000_000 + i * 256 + t for t in range(256)])
        client.put(keys, [os.urandom(CHUNK)])


def test_local_live_reader_keeps_its_bytes_past_the_ttl(start_daemon):
    d = start_daemon(*TTL_ARGS)
    with d.client(namespace="reader") as reader, d.client(namespace="writer") as writer:
        keys = reader.chunk_keys(list(range(256)))
        original = os.urandom(CHUNK)
        reader.put(keys, [original])
        with reader.get(keys) as views:
            assert wait_for(lambda: writer.stats()["leases_overdue"] == 1, 30)   # past the TTL, and kept
            overwrite_arena(writer)
            assert bytes(views[0]) == original, "the bytes under a live reader's view changed"
        stats = writer.stats()
        assert stats["leases"] == 0 and stats["leases_overdue"] == 1 and stats["counters"]["expired_leases"] == 0


READER = textwrap.dedent("""
    import hashlib, sys, kvstore
    c = kvstore.connect(sys.argv[1], namespace="reader", timeout=10)
    keys = c.chunk_keys(list(range(256)))
    c.put(keys, [bytes(range(256)) * 4096])
    outcome = "unchanged"
    try:
        with c.get(keys) as views:
            before = hashlib.sha256(views[0]).hexdigest()
            print("holding", flush=True)
            sys.stdin.readline()                      # the parent waits out the TTL and overwrites the arena
            changed = hashlib.sha256(views[0]).hexdigest() != before
    except kvstore.LeaseError:
        outcome = "told"
    else:
        outcome = "changed-and-trusted" if changed else "unchanged"
    print(outcome, "changed" if changed else "same", flush=True)
""")


def unshare_prefix() -> list[str]:
    """A command prefix that runs a process in a new pid namespace (with its own /proc), or skips the test."""
    tool = shutil.which("unshare")
    for prefix in (["--pid", "--fork", "--mount-proc"],
                   ["--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]):
        if tool and subprocess.run([tool, *prefix, "true"], capture_output=True, timeout=10).returncode == 0:
            return [tool, *prefix]
    pytest.skip("cannot start a process in a new pid namespace here (unshare --pid refused)")


def test_reader_the_daemon_cannot_follow_is_told_its_lease_was_lost(start_daemon):
    d = start_daemon(*TTL_ARGS)
    child = subprocess.Popen([*unshare_prefix(), sys.executable, "-c", READER, d.address], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=os.environ)
    try:
        assert child.stdout.readline().strip() == "holding"
        with d.client(namespace="writer") as writer:
            assert writer.stats()["leases"] == 1
            # past the TTL, the lease of a process the daemon cannot see is taken back
            assert wait_for(lambda: writer.stats()["counters"]["expired_leases"] == 1, 30)
            overwrite_arena(writer)
            assert writer.stats()["counters"]["expired_leases"] == 1
        child.stdin.write("go\n")
        child.stdin.flush()
        outcome, bytes_state = child.stdout.readline().split()
    finally:
        child.kill()
        child.wait()
    assert outcome != "changed-and-trusted"
    assert (outcome, bytes_state) == ("told", "changed")   # the arena was overwritten, and the reader knew


def test_overdue_handles_of_spared_owners_stay_until_taken():
    table: HandleTable[str] = HandleTable("lease", kvstore.LeaseError)
    live = table.issue(b"live", "a", ttl=1.0, now=0.0)
    gone = table.issue(b"gone", "b", ttl=1.0, now=0.0)
    expired = table.pop_expired(5.0, keep=lambda owner: owner == b"live")
    assert [h.id for h in expired] == [gone.id]
    assert table.overdue == 1 and table.peek(b"live", live.id).deadline == math.inf
    assert table.pop_expired(1e9, keep=lambda owner: False) == []   # overdue handles have no deadline any more
    assert table.take(b"live", live.id).payload == "a" and len(table) == 0
