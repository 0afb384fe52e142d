"""A real daemon enforces its tenants' identities: a namespace of a tenant that does not list our uid refuses our
writes and deletes and misses our reads; one that lists our uid works as any other."""

from __future__ import annotations

import os

import pytest

import kvstore
from harness.servers import free_port

pytestmark = pytest.mark.integration

STRANGER = os.getuid() + 54321   # a uid that is not ours
TABLE = f"""
[tenants.theirs]
namespaces = ["theirs:"]
uids = [{STRANGER}]
[tenants.ours]
namespaces = ["ours:"]
uids = [{os.getuid()}]
"""


def _daemon(start_daemon, tmp_path):
    config = tmp_path / "kvstore.toml"
    config.write_text(TABLE)
    return start_daemon("--config", str(config), "--host-mem", "16MiB", "--disk-size", "0")


def test_a_tenant_that_does_not_list_us_refuses_writes_and_misses_reads(start_daemon, tmp_path):
    daemon = _daemon(start_daemon, tmp_path)
    keys = [os.urandom(16) for _ in range(2)]
    with daemon.client(namespace="theirs:a") as theirs:
        with pytest.raises(kvstore.PermissionDeniedError, match="namespace 'theirs:a' belongs to tenant theirs"):
            theirs.put(keys, [b"x" * 4096] * 2)
        with pytest.raises(kvstore.PermissionDeniedError, match="tenant theirs"):
            theirs.delete(keys)
        assert theirs.lookup(keys) == 0


def test_a_tenant_that_lists_our_uid_works(start_daemon, tmp_path):
    daemon = _daemon(start_daemon, tmp_path)
    keys = [os.urandom(16) for _ in range(2)]
    with daemon.client(namespace="ours:a") as ours:
        ours.put(keys, [b"y" * 4096] * 2)
        assert ours.lookup(keys) == 2
        assert ours.delete(keys) == 2
        assert ours.lookup(keys) == 0


def test_a_client_whose_principal_is_unknown_is_refused_a_restricted_namespace(start_daemon, tmp_path):
    """Over tcp:// the daemon cannot tell who the client is: a restricted tenant fails closed, even ours."""
    port = free_port()
    config = tmp_path / "kvstore.toml"
    config.write_text(TABLE)
    start_daemon("--config", str(config), "--host-mem", "16MiB", "--disk-size", "0", "--tcp", f"127.0.0.1:{port}")
    keys = [os.urandom(16)]
    with kvstore.connect(f"tcp://127.0.0.1:{port}", namespace="ours:a", timeout=10.0) as remote:
        with pytest.raises(kvstore.PermissionDeniedError, match="tenant ours"):
            remote.put(keys, [b"z" * 4096])
        assert remote.lookup(keys) == 0
    with kvstore.connect(f"tcp://127.0.0.1:{port}", namespace="open", timeout=10.0) as anyone:
        anyone.put(keys, [b"z" * 4096])   # namespaces no restricted tenant owns stay open
        assert anyone.lookup(keys) == 1
