"""Keys bound to their namespace with tenants: two namespaces of one restricted tenant (one key space) each keep
their own chunks, and a client of another user in another tenant's namespace that sends a restricted tenant's
keys stores and reads its own chunks only."""

from __future__ import annotations

import os

import pytest

import kvstore
from harness.daemons import short_tempdir
from support.users import as_other_user

pytestmark = pytest.mark.integration

CHUNK = 4096
GOOD, EVIL = b"GOODGOOD" * (CHUNK // 8), b"EVILEVIL" * (CHUNK // 8)
STRANGER_UID = 65533   # a uid no tenant lists (setuid takes any number)
TABLE = '[tenants.alpha]\nnamespaces = ["alpha:"]\nuids = [0]\n[tenants.beta]\nnamespaces = ["beta:"]\n'


def read(client, keys: list[bytes]) -> list[bytes]:
    with client.get(keys) as views:
        return [bytes(v) for v in views]


def start(start_daemon, tmp_path):
    config = tmp_path / "kvstore.toml"
    config.write_text(TABLE)
    workdir = short_tempdir()
    os.chmod(workdir, 0o755)
    return start_daemon("--config", str(config), "--host-mem", "16MiB", "--disk-size", "0", workdir=workdir)


def test_two_namespaces_of_one_restricted_tenant_keep_their_own_chunks(start_daemon, tmp_path):
    d = start(start_daemon, tmp_path)
    with d.client(namespace="alpha:m1", chunk_tokens=16) as a, d.client(namespace="alpha:m2", chunk_tokens=16) as b:
        keys = a.chunk_keys(list(range(64)))
        assert b.put(keys, [EVIL] * 4) == 4            # alpha:m2 first, under alpha:m1's keys
        assert a.lookup(keys) == 0
        assert a.put(keys, [GOOD] * 4) == 4            # stored, not skipped
        assert read(a, keys) == [GOOD] * 4 and read(b, keys) == [EVIL] * 4


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user (setuid in a child)")
def test_another_users_client_in_another_tenant_reaches_only_its_own_chunks(start_daemon, tmp_path):
    d = start(start_daemon, tmp_path)
    os.chmod(d.socket_path, 0o666)   # the operator lets the other user reach the socket
    with d.client(namespace="alpha:m", chunk_tokens=16) as a:
        keys = a.chunk_keys(list(range(64)))

    def probe() -> list[str]:   # in the open tenant, under the restricted tenant's keys, before and after it puts
        with kvstore.connect(d.address, namespace="beta:m", chunk_tokens=16, timeout=10) as c:
            c.put(keys, [EVIL] * 4)
            return [f"reads own {read(c, keys) == [EVIL] * 4}"]

    assert as_other_user(STRANGER_UID, STRANGER_UID, probe) == ["reads own True"]
    with d.client(namespace="alpha:m", chunk_tokens=16) as a:
        assert a.lookup(keys) == 0
        assert a.put(keys, [GOOD] * 4) == 4
        assert read(a, keys) == [GOOD] * 4
    assert as_other_user(STRANGER_UID, STRANGER_UID, probe) == ["reads own True"]
    with d.client(namespace="alpha:m", chunk_tokens=16) as a:
        assert read(a, keys) == [GOOD] * 4
