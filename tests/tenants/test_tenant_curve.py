"""Over tcp:// with CURVE a session's principal is its client's public key: a tenant's ``curve_keys`` admit it,
and another tenant's key is refused writes, deletes and clears, and misses reads."""

from __future__ import annotations

import os

import pytest

import kvstore
from kvstore.security import ClientCurve, generate_keypair
from kvstore.security.keys import load_public_key
from harness.workload import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def curve_daemon(start_daemon, tmp_path):
    """A daemon on tcp:// with CURVE, two allowed clients A and B, and tenants a and b, each listing one key."""
    base = str(tmp_path)
    server_public, server_secret = generate_keypair(os.path.join(base, "server"), "server")
    secrets = {}
    public = {}
    for name in ("a", "b"):
        key, secret = generate_keypair(os.path.join(base, "clients"), name)
        secrets[name], public[name] = secret, load_public_key(key, "key").decode()
    config = tmp_path / "kvstore.toml"
    config.write_text("".join(f'[tenants.{n}]\nnamespaces = ["{n}:"]\ncurve_keys = ["{public[n]}"]\n'
                              for n in ("a", "b")))
    port = free_port()
    start_daemon("--config", str(config), "--host-mem", "16MiB", "--disk-size", "0", "--tcp", f"127.0.0.1:{port}",
                 "--curve-server-key", server_secret, "--curve-client-keys", os.path.join(base, "clients"))

    def connect(name: str, namespace: str) -> kvstore.Client:
        curve = ClientCurve.load(server_public, secrets[name])
        return kvstore.connect(f"tcp://127.0.0.1:{port}", namespace=namespace, curve=curve, timeout=10.0)
    return connect


def test_a_curve_key_acts_as_its_tenant_and_no_other(curve_daemon):
    keys = [os.urandom(16) for _ in range(3)]
    payloads = [bytes([i]) * 4096 for i in range(3)]
    with curve_daemon("a", "a:model") as a:
        a.put(keys, payloads)
        assert a.lookup(keys) == 3
        with a.get(keys) as views:
            assert [bytes(v) for v in views] == payloads
    with curve_daemon("b", "a:model") as b_in_a:
        with pytest.raises(kvstore.PermissionDeniedError, match="belongs to tenant a"):
            b_in_a.put([os.urandom(16)], [b"b" * 4096])
        with pytest.raises(kvstore.PermissionDeniedError, match="belongs to tenant a"):
            b_in_a.delete(keys)
        with pytest.raises(kvstore.PermissionDeniedError, match="belongs to tenant a"):
            b_in_a.clear()
        assert b_in_a.lookup(keys) == 0
        with b_in_a.get(keys) as views:
            assert len(views) == 0
    with curve_daemon("b", "b:model") as b:   # its own tenant: it writes there, and A's chunks are a miss
        b.put([os.urandom(16)], [b"b" * 4096])
        assert b.lookup(keys) == 0
        with b.get(keys) as views:
            assert len(views) == 0
        assert b.delete(keys) == 0
    with curve_daemon("a", "a:model") as a:
        assert a.lookup(keys) == 3   # nothing B did touched them
        assert a.delete(keys) == 3
        assert a.lookup(keys) == 0
