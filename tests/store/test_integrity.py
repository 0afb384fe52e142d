"""Never serve a wrong chunk: another process scribbles on the shared arena (or a disk file), and the daemon's
checksums, scrubs and verified gets find every damaged chunk, drop it with its continuations (or repair it from
an intact copy) and leave everything else alone."""

from __future__ import annotations

import json
import os

import pytest

import kvstore
from kvstore.binding import rebind
from conftest import wait_for
from harness.daemons import run_cli
from support.scribble import damage, damage_file

CHUNK = 256


def chain(client: kvstore.Client, seed: int, n: int = 4, size: int = 50_000) -> tuple[list[bytes], list[bytes]]:
    keys = client.chunk_keys([seed * 1_000_000 + t for t in range(n * CHUNK)])
    return keys, [os.urandom(size + 512 * i) for i in range(n)]


def arena_of(client: kvstore.Client) -> str:
    return client.server_info["arena"]["path"]


def stored(client: kvstore.Client, keys: list[bytes], payloads: list[bytes]) -> int:
    """How many leading chunks a get hands out, after checking that each is byte-exact."""
    with client.get(keys) as views:
        for view, payload in zip(views, payloads):
            assert bytes(view) == payload
        return len(views)


def sums_taken(client: kvstore.Client, n: int) -> None:
    assert wait_for(lambda: client.stats()["integrity"]["sums"] >= n and
                    client.stats()["integrity"]["sums_pending"] == 0)


def scrub_cli(daemon, *extra: str) -> tuple[int, dict]:
    out = run_cli("scrub", "--socket", daemon.socket_path, "--json", *extra, timeout=120)
    return out.returncode, json.loads(out.stdout)


@pytest.fixture
def host_only(start_daemon):
    d = start_daemon("--disk-size", "0")
    c = d.client(namespace="scrub")
    yield d, c
    c.close()


def test_scrub_drops_every_damaged_chunk_with_its_continuations_and_nothing_else(host_only):
    d, c = host_only
    chains = [chain(c, seed) for seed in range(3)]
    for keys, payloads in chains:
        assert c.put(keys, payloads) == 4
    sums_taken(c, 12)
    (ka, pa), (kb, pb), (kc, pc) = chains
    damage(arena_of(c), [pa[1], pb[3]])

    code, report = scrub_cli(d)
    assert code == 3   # something was damaged
    host = report["tiers"]["host"]
    assert (host["corrupt"], host["dropped"]) == (2, 4)
    assert host["checked"] == 10   # A's chunks 2 and 3 went with chunk 1 before the pass reached them
    assert [c.lookup(ka), c.lookup(kb), c.lookup(kc)] == [1, 3, 4]
    assert stored(c, ka, pa) == 1 and stored(c, kb, pb) == 3 and stored(c, kc, pc) == 4

    code, report = scrub_cli(d)
    assert code == 0 and report["checked"] == 8 and report["corrupt"] == 0
    stats = c.stats()
    assert stats["integrity"]["corrupt_host"] == 2 and stats["integrity"]["dropped"] == 4
    assert stats["scrub"]["passes"] == 2 and stats["scrub"]["tiers"]["host"]["corrupt"] == 2


def test_background_scrub_finds_damage_by_itself(start_daemon):
    d = start_daemon("--disk-size", "0", "--scrub-rate", "200MiB")
    c = d.client(namespace="bg")
    keys, payloads = chain(c, 7)
    other_keys, other = chain(c, 8)
    c.put(keys, payloads)
    c.put(other_keys, other)
    sums_taken(c, 8)
    damage(arena_of(c), [payloads[2]])
    assert wait_for(lambda: c.stats()["scrub"]["tiers"]["host"]["corrupt"] == 1, timeout=20)
    assert c.lookup(keys) == 2 and stored(c, other_keys, other) == 4
    assert "event=scrub_done" in d.log() and "event=chunk_corrupt" in d.log()
    c.close()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_verified_get_never_returns_damaged_bytes(start_daemon, transport):
    from harness.workload import free_port

    port = free_port()
    d = start_daemon("--disk-size", "0", "--tcp", f"127.0.0.1:{port}")
    writer = d.client(namespace="v")
    reader = writer if transport == "ipc" else kvstore.connect(f"tcp://127.0.0.1:{port}", namespace="v")
    keys, payloads = chain(writer, 3)
    writer.put(keys, payloads)
    sums_taken(writer, 4)
    damage(arena_of(writer), [payloads[2]])

    with reader.get(keys) as views:   # without verification the damage is handed out, as before
        assert len(views) == 4 and bytes(views[2]) != payloads[2]
    with reader.get(keys, verify=True) as views:
        assert len(views) == 2
        assert [bytes(v) for v in views] == payloads[:2]
    stats = writer.stats()
    assert stats["integrity"]["reported"] == 1 and stats["integrity"]["corrupt_host"] == 1
    assert writer.lookup(keys) == 2   # the daemon checked it itself and dropped chunks 2 and 3
    if reader is not writer:
        reader.close()
    writer.close()


def test_verified_get_waits_for_the_sum_of_a_fresh_commit(host_only):
    _, c = host_only
    keys, payloads = chain(c, 11, n=8, size=2 << 20)
    c.put(keys, payloads)
    with c.get(keys, verify=True) as views:   # straight after commit: the sums may still be being taken
        assert [bytes(v) for v in views] == payloads


def test_damaged_dram_copy_is_repaired_from_its_disk_copy(daemon):
    c, keys, payloads = on_disk(daemon, "repair", 5)
    damage(arena_of(c), [payloads[1]])
    _code, report = scrub_cli(daemon)
    assert report["tiers"]["host"]["corrupt"] == 1 and report["dropped"] == 0
    assert report["tiers"]["disk"]["checked"] == 4 and report["tiers"]["disk"]["corrupt"] == 0
    assert c.lookup_tiers(keys).tiers == {"host": 3, "disk": 1}
    assert stored(c, keys, payloads) == 4   # chunk 1 read back from its file, checked
    assert c.stats()["integrity"]["repaired"] == 1
    c.close()


def on_disk(daemon, namespace: str, seed: int) -> tuple[kvstore.Client, list[bytes], list[bytes]]:
    """A chain of four chunks put and written back to the disk tier."""
    c = daemon.client(namespace=namespace)
    keys, payloads = chain(c, seed)
    c.put(keys, payloads)
    assert wait_for(lambda: c.stats()["counters"]["disk_writes"] >= 4)
    return c, keys, payloads


def test_damaged_disk_copy_of_a_chunk_in_dram_is_rewritten_never_served(daemon):
    c, keys, payloads = on_disk(daemon, "disk", 6)
    name = rebind("disk", keys[2]).hex()   # files are named by the key bound to the namespace
    path = os.path.join(daemon.workdir, "disk", name[:2], name + ".kv")
    damage_file(path, 4096 + 100)
    _code, report = scrub_cli(daemon)
    assert report["tiers"]["disk"]["corrupt"] == 1 and report["dropped"] == 0
    assert os.path.exists(os.path.join(daemon.workdir, "disk", "quarantine", name + ".kv"))
    assert wait_for(lambda: c.stats()["counters"]["disk_writes"] >= 5)   # written again from DRAM
    _code, report = scrub_cli(daemon)
    assert report["corrupt"] == 0 and report["tiers"]["disk"]["checked"] == 4
    c.close()
    daemon.restart()   # DRAM is gone: every chunk now comes from its file, checked on read
    c = daemon.client(namespace="disk")
    assert stored(c, keys, payloads) == 4
    c.close()


def test_damaged_file_without_dram_copy_is_a_miss_and_drops_its_continuations(daemon):
    c, keys, payloads = on_disk(daemon, "cold", 9)
    c.close()
    daemon.restart()
    name = rebind("cold", keys[1]).hex()
    damage_file(os.path.join(daemon.workdir, "disk", name[:2], name + ".kv"), 4096 + 7)
    c = daemon.client(namespace="cold")
    assert stored(c, keys, payloads) == 1
    assert c.lookup(keys) == 1
    stats = c.stats()
    assert stats["counters"]["checksum_failures"] == 1 and stats["integrity"]["dropped"] == 3
    c.close()


def test_verify_report_drops_the_chain_and_is_counted(host_only):
    d, c = host_only
    keys, payloads = chain(c, 12)
    c.put(keys, payloads)
    assert c.report_verify("scrub", keys, 4, 0, 1e-6) == 0
    assert c.lookup(keys) == 4
    assert c.report_verify("scrub", keys, 4, 1, 7.5, first_bad=2) == 2
    assert c.lookup(keys) == 2
    v = c.stats()["verify"]
    assert v == {"reports": 2, "checks": 8, "mismatches": 1, "max_difference": 7.5, "dropped": 2}
    assert "event=verify_mismatch namespace=scrub" in d.log()
    with pytest.raises(kvstore.BadRequestError, match="first_bad"):
        c.report_verify("scrub", keys, 4, 1, 1.0)
    with pytest.raises(kvstore.BadRequestError, match="mismatches"):
        c.report_verify("scrub", keys, 2, 3, 1.0, first_bad=0)


def test_client_with_other_key_parameters_gets_a_clear_error(host_only):
    d, c = host_only
    keys, payloads = chain(c, 13)
    c.put(keys, payloads)
    for kwargs, named in (({"chunk_tokens": 128}, "chunk_tokens"), ({"hash_seed": 7}, "hash_seed"),
                          ({"key_scheme": "vllm-sha256"}, "key_scheme")):
        with pytest.raises(kvstore.IncompatibleError, match=named):
            d.client(namespace="scrub", **kwargs)
    other = d.client(namespace="elsewhere", chunk_tokens=128)   # another namespace is another matter
    other.close()
    c.clear()
    late = d.client(namespace="scrub", chunk_tokens=128)   # nothing held any more: accepted
    late.close()
    c.close()


def test_damaged_gpu_copy_is_found_by_scrub_and_the_dram_copy_served(start_daemon):
    from kvstore.mapped.arena import arena_path_for

    d = start_daemon("--gpu-mem", "1MiB", "--disk-size", "0", env={"KVSTORE_GPU_TIER_DEVICE": "cpu"})
    c = d.client(namespace="gpu", chunk_tokens=4)
    keys = c.chunk_keys(list(range(16)))
    payloads = [os.urandom(100_000) for _ in keys]
    c.put(keys, payloads)
    sums_taken(c, 4)
    for _ in range(2):   # the second get asks for promotion; the slots are checked before the copies up
        with c.get(keys):
            pass
    assert wait_for(lambda: c.lookup_tiers(keys).tiers == {"gpu": 4})
    damage(arena_path_for(d.socket_path + "#gpu"), [payloads[1]])   # the CPU-backed GPU pool's own file
    _code, report = scrub_cli(d)
    assert report["tiers"]["gpu"]["corrupt"] == 1 and report["tiers"]["host"]["corrupt"] == 0
    assert report["dropped"] == 0 and c.stats()["integrity"]["repaired"] == 1   # the DRAM copy stays
    assert c.lookup_tiers(keys).tiers == {"gpu": 3, "host": 1}
    assert stored(c, keys, payloads) == 4
    c.close()
