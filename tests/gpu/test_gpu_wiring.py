"""The GPU tier wired into a real daemon, run on a CPU-backed pool (KVSTORE_GPU_TIER_DEVICE=cpu) through the
same code as on a GPU: HELLO export and mapping, promotion on repeated hits, demotion past the high watermark
(free, or copied back down into DRAM), leased chunks never demoted, stats, and tensor views for GPU slots."""

from __future__ import annotations


import pytest

from conftest import wait_for as _wait_for
from harness.daemons import run_cli
import torch
from harness.workload import payload_for

from kvstore.metrics.collector import unmapped_paths

GPU_ENV = {"KVSTORE_GPU_TIER_DEVICE": "cpu"}
CHUNK = 200 << 10   # five of them pass the 1 MiB GPU tier's high watermark; four stay under it


def read(view) -> bytes:
    return bytes(view.numpy()) if isinstance(view, torch.Tensor) else bytes(view)


def wait_for(predicate, what: str, timeout: float = 15.0) -> None:
    if not _wait_for(predicate, timeout, interval=0.02):
        raise AssertionError(f"timed out waiting for {what}")


def counters(client) -> dict:
    return client.stats()["counters"]


def promote(client, keys: list[bytes], expect_promotions: int) -> None:
    """Two gets: the second asks for promotion; wait until the mover has done it."""
    for _ in range(2):
        with client.get(keys):
            pass
    wait_for(lambda: counters(client)["promotions_host_gpu"] >= expect_promotions, "promotions")


@pytest.fixture
def gpu_daemon(start_daemon):
    def start(*args: str):
        return start_daemon("--gpu-mem", "1MiB", *args, env=GPU_ENV)
    return start


def test_promotion_stats_and_tensor_views(gpu_daemon):
    d = gpu_daemon("--host-mem", "8MiB")
    with d.client(namespace="gpu", chunk_tokens=4, gpu=True) as c, d.client(namespace="gpu", chunk_tokens=4) as plain:
        assert c.server_info["gpu"]["device"] == "cpu" and c.gpu_pool is not None
        assert plain.server_info["gpu"] is None and plain.gpu_pool is None  # asked for nothing: gets nothing
        keys = c.chunk_keys(list(range(16)))
        data = [payload_for(k, CHUNK) for k in keys]
        assert c.put(keys, data) == 4
        with c.get(keys) as lease:
            assert all(isinstance(v, memoryview) for v in lease)  # first hit: still in DRAM
        assert c.lookup_tiers(keys).tiers == {"host": 4}
        promote(c, keys, 4)
        assert c.lookup_tiers(keys).tiers == {"gpu": 4}

        lease = c.get(keys)
        assert lease.tiers == ["gpu"] * 4
        assert all(isinstance(v, torch.Tensor) and v.dtype == torch.uint8 for v in lease.views)
        assert [read(v) for v in lease.views] == data
        lease.release()
        with plain.get(keys) as views:  # a reader without the mapping reads the DRAM copies
            assert all(isinstance(v, memoryview) for v in views) and [read(v) for v in views] == data

        stats = c.stats()
        assert stats["tiers"]["gpu"] == {"capacity_bytes": 1 << 20, "used_bytes": 4 * CHUNK, "chunks": 4,
                                         "device": "cpu"}
        assert set(stats["tiers"]) == {"gpu", "host", "disk"}
        assert unmapped_paths(stats) == []   # every GPU number has its Prometheus metric
        assert stats["counters"]["promoted_bytes_host_gpu"] == 4 * CHUNK

        more = c.chunk_keys(list(range(4 * 48)))[4:]   # 44 more chunks: DRAM (40 chunks) lets A's copies go
        chain = keys[-1:] + more
        for i in range(0, 44, 4):
            c.put(more[i:i + 4], [payload_for(k, CHUNK) for k in more[i:i + 4]], parent=chain[i])
        wait_for(lambda: c.stats()["tiers"]["host"]["chunks"] <= 40, "DRAM pressure")
        assert c.lookup_tiers(keys).tiers == {"gpu": 4}   # the GPU copies stay when the DRAM copies go
        with c.get(keys) as views:
            assert [read(v) for v in views] == data
        with plain.get(keys) as views:                      # copied down (or read back from disk) for this one
            assert [read(v) for v in views] == data


def test_demotion_spares_leases_and_copies_gpu_only_chunks_down(gpu_daemon):
    # No disk tier and a 2 MiB host tier (ten chunks): DRAM pressure leaves chunks in the GPU tier alone.
    d = gpu_daemon("--host-mem", "2MiB", "--disk-size", "0")
    with d.client(namespace="gpu", chunk_tokens=4, gpu=True) as c, d.client(namespace="gpu", chunk_tokens=4) as plain:
        keys = c.chunk_keys(list(range(4 * 14)))
        data = {k: payload_for(k, CHUNK) for k in keys}
        a, b = keys[:4], keys[4:]
        c.put(a, [data[k] for k in a])
        promote(c, a, 4)
        c.put(b, [data[k] for k in b], parent=a[-1])   # evicts A's DRAM copies: A lives in the GPU tier alone
        assert c.lookup_tiers(a).tiers == {"gpu": 4}
        assert c.stats()["tiers"]["host"]["chunks"] == 10

        held = c.get(a)                                # leased: never demoted
        assert held.tiers == ["gpu"] * 4
        promote(c, b[:1], 5)                           # 5 chunks pass the high watermark
        wait_for(lambda: counters(c)["demotions_gpu_host"] >= 1, "a demotion")
        assert c.lookup_tiers(a).tiers == {"gpu": 4}
        assert counters(c)["gpu_copies_down"] == 0     # the unleased victim had its DRAM copy: freed at once
        assert [read(v) for v in held.views] == [data[k] for k in a]
        held.release()

        promote(c, b[:1], 6)                           # now the oldest unleased GPU chunks are A's
        wait_for(lambda: counters(c)["gpu_copies_down"] >= 1, "a copy down")
        stats = c.stats()
        assert stats["tiers"]["gpu"]["used_bytes"] <= 0.95 * stats["tiers"]["gpu"]["capacity_bytes"]

        with plain.get(a) as views:                    # GPU-only chunks are copied down for this reader
            assert len(views) == 4 and [read(v) for v in views] == [data[k] for k in a]
        assert c.lookup_tiers(a).tiers.get("gpu", 0) < 4
        with c.get(a) as views:
            assert [read(v) for v in views] == [data[k] for k in a]
        assert counters(c)["gpu_copies_down"] >= 2


def test_testing_switch_accepts_only_cpu(tmp_path):
    env = {"KVSTORE_GPU_TIER_DEVICE": "cuda"}
    result = run_cli("serve", "--socket", str(tmp_path / "s"), "--host-mem", "8MiB", "--gpu-mem", "1MiB", env=env)
    assert result.returncode == 2
    assert "KVSTORE_GPU_TIER_DEVICE='cuda': the only accepted value is 'cpu'" in result.stderr
