"""A read of another tenant's chunk that only the disk holds is a plain miss: it neither reads the chunk back
into DRAM (which would move the other tenant's chunk and charge its budget) nor waits for that read (which would
tell it apart from a miss by milliseconds), whether a lookup or a get asks, on a real daemon with a disk tier."""

from __future__ import annotations

import os

import pytest

from harness.daemons import run_cli
from support.disk import wait_written

pytestmark = pytest.mark.integration

MiB = 1 << 20
STRANGER = os.getuid() + 54321   # a uid that is not ours


def _table(restricted: bool) -> str:
    uids = f"uids = [{STRANGER}]\n" if restricted else ""
    return f'[tenants.theirs]\nnamespaces = ["theirs:"]\n{uids}'


def test_a_forbidden_disk_only_chunk_is_not_read_back(start_daemon, tmp_path):
    config = tmp_path / "kvstore.toml"
    config.write_text(_table(restricted=False))
    daemon = start_daemon("--config", str(config), "--host-mem", "16MiB")
    with daemon.client(namespace="theirs:m", chunk_tokens=4) as theirs:
        keys = theirs.chunk_keys(list(range(16)))
        theirs.put(keys, [os.urandom(MiB) for _ in keys])
        wait_written(theirs)
    with daemon.client(namespace="filler", chunk_tokens=4) as filler:
        for i in range(30):   # push their chain out of DRAM: on disk only
            filler.put(filler.chunk_keys([100 + i] * 4), [os.urandom(MiB)])
        wait_written(filler)
    with daemon.client(namespace="theirs:m", chunk_tokens=4) as theirs:
        assert theirs.lookup_tiers(keys, promote=False).tiers == {"disk": 4}
    config.write_text(_table(restricted=True))
    assert run_cli("reload", "--socket", daemon.socket_path).returncode == 0

    with daemon.client(namespace="ours:m", chunk_tokens=4, shared_index=False) as ours:
        before = ours.stats()["counters"]
        with ours.get(keys) as views:
            assert len(views) == 0
        assert ours.lookup(keys) == 0
        after = ours.stats()   # a read started by the get or the lookup would be in flight or done by now
    assert after["disk"]["reads_in_flight"] == 0, "a read of another tenant's chunk was started"
    assert after["counters"]["disk_reads"] == before["disk_reads"], "another tenant's chunk was read back from disk"
