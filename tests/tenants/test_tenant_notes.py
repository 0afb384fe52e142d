"""A LOOKUP_SEEN note (lookups and gets a client answered from the shared index) that names another tenant's
chunks neither touches them (keeping them hot against eviction) nor counts them as hits: the shared index never
lists a restricted tenant's chunks, so such a note is not the index's."""

from __future__ import annotations

import os

import pytest

from kvstore.protocol.wire import Op
from harness.daemons import run_cli

pytestmark = pytest.mark.integration

STRANGER = os.getuid() + 54321   # a uid that is not ours


def test_a_note_naming_another_tenants_chunks_is_not_counted(start_daemon, tmp_path):
    config = tmp_path / "kvstore.toml"
    config.write_text('[tenants.theirs]\nnamespaces = ["theirs:"]\n')
    daemon = start_daemon("--config", str(config), "--host-mem", "16MiB", "--disk-size", "0")
    keys = [os.urandom(16) for _ in range(4)]
    with daemon.client(namespace="theirs:m") as theirs:
        theirs.put(keys, [b"t" * 4096] * 4)
    config.write_text(f'[tenants.theirs]\nnamespaces = ["theirs:"]\nuids = [{STRANGER}]\n')
    assert run_cli("reload", "--socket", daemon.socket_path).returncode == 0
    with daemon.client(namespace="ours:m", shared_index=False) as ours:
        before = ours.stats()
        ours.request({"op": Op.LOOKUP_SEEN, "asked": [4], "found": [b"".join(keys)], "read": [b"".join(keys)]})
        after = ours.stats()
    assert after["counters"]["hit_keys"] == before["counters"]["hit_keys"]
    assert after["counters"]["gets"] - before["counters"]["gets"] <= 1   # the read note, counted as an empty get
    assert after["counters"]["get_chunks"] == before["counters"]["get_chunks"]
    assert after["tenants"]["default"]["hit_tokens"] == before["tenants"]["default"]["hit_tokens"]
    assert after["tenants"]["default"]["lookup_tokens"] == before["tenants"]["default"]["lookup_tokens"] + 4 * 256
