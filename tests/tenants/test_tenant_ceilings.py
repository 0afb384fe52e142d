"""A real daemon holds a tenant to its DRAM ceiling on puts into put credits as on reserve + commit: the
tenant's own oldest chunks go first, and when they cannot (all leased) the put is refused naming the tenant and
its budget, the credit's space goes back to the free space, and nothing stored is lost."""

from __future__ import annotations

import os

import pytest

import kvstore

pytestmark = pytest.mark.integration

CHUNK = 64 * 1024
TABLE = """
[tenants.chat.dram]
ceiling = "1MiB"
[tenants.chat]
namespaces = ["chat:"]
"""


def _daemon(start_daemon, tmp_path):
    config = tmp_path / "kvstore.toml"
    config.write_text(TABLE)
    return start_daemon("--config", str(config), "--host-mem", "16MiB", "--disk-size", "0")


def _tenant(client: kvstore.Client) -> dict:
    return client.stats()["tenants"]["chat"]


def test_credit_puts_are_held_to_the_tenants_dram_ceiling(start_daemon, tmp_path):
    daemon = _daemon(start_daemon, tmp_path)
    with daemon.client(namespace="chat:m") as c:
        puts_before = c.stats()["credits"]["puts"]
        chains = [[os.urandom(16) for _ in range(4)] for _ in range(8)]   # 32 chunks: twice the ceiling
        for i, keys in enumerate(chains):
            assert c.put(keys, [bytes([i]) * CHUNK] * 4) == 4
            assert _tenant(c)["dram_bytes"] <= 1024 * 1024
        stats = c.stats()
        assert stats["credits"]["puts"] - puts_before == len(chains)   # every put went through a credit
        assert stats["tenants"]["chat"]["dram_bytes"] == 1024 * 1024
        assert c.lookup(chains[-1]) == 4 and c.lookup(chains[0]) == 0   # its own oldest went


def test_a_credit_put_its_leased_chunks_block_is_refused_naming_the_tenant(start_daemon, tmp_path):
    daemon = _daemon(start_daemon, tmp_path)
    with daemon.client(namespace="chat:m") as c:
        chains = [[os.urandom(16) for _ in range(4)] for _ in range(4)]   # exactly the ceiling
        for keys in chains:
            assert c.put(keys, [b"k" * CHUNK] * 4) == 4
        held = [c.get(keys) for keys in chains]   # every chunk of the tenant leased: none may leave
        try:
            used = c.stats()["tiers"]["host"]["used_bytes"]
            with pytest.raises(kvstore.StoreFullError, match=r"tenant chat is at its dram ceiling \(.*ceiling "
                                                             r"1.0 MiB; 1.0 MiB held, none of it evictable now\)"):
                c.put([os.urandom(16)], [b"n" * CHUNK])
            stats = c.stats()
            assert stats["credits"]["active"] == 0 and stats["credits"]["lent_bytes"] == 0   # the credit went back
            assert stats["tiers"]["host"]["used_bytes"] <= used
            assert stats["tenants"]["chat"]["ceiling_refusals"] == 1
        finally:
            for lease in held:
                lease.release()
        assert all(c.lookup(keys) == 4 for keys in chains)   # nothing stored was lost
        assert c.put([os.urandom(16)], [b"m" * CHUNK]) == 1   # leases gone: its oldest chunk makes the room
