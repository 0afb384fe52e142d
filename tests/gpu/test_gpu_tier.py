"""The GPU tier's bookkeeping and data movement, on CPU tensors through the same code; its settings; the
pinned-memory fallback; and chunks from a paged cache through a real daemon and back into another cache."""

from __future__ import annotations

import os

import pytest
import torch

from kvstore.mapped.gpu_pool import MappedPool, load_async, save_async
from kvstore.mapped.pool_ipc import PoolExport
from kvstore.mapped.page_lock import buffer_address, memlock_limit, page_lock
from kvstore.tiers.gpu.tier import GpuTier
from kvstore.ops import PagedKV, gather
from kvstore.mapped.arena import SharedArena

from harness.daemons import run_cli

MiB = 1 << 20


@pytest.fixture
def arena(tmp_path):
    a = SharedArena.create(f"/dev/shm/kvstore-test-{os.getpid()}-{tmp_path.name}.arena", 4 * MiB)
    yield a
    a.close()


def test_allocate_free_usage_and_full(arena):
    tier = GpuTier(1 * MiB, "cpu", arena.buf, arena.size)
    assert tier.capacity_bytes == MiB and tier.used_bytes == 0
    a = tier.allocate(300_000)
    b = tier.allocate(300_000)
    assert a is not None and b is not None and a != b
    assert tier.usage().chunks == 2 and tier.used_bytes >= 600_000
    assert tier.allocate(600_000) is None  # full: the tier manager must demote first
    tier.free(a)
    assert tier.allocate(200_000) is not None
    with pytest.raises(ValueError):
        tier.free(12345)
    tier.close()


def test_write_read_and_moves_to_and_from_the_host_arena(arena):
    tier = GpuTier(1 * MiB, "cpu", arena.buf, arena.size)
    data = os.urandom(70_000)
    slot = tier.allocate(len(data))
    tier.write(slot, data)
    assert bytes(tier.read(slot, len(data)).numpy()) == data

    demote = tier.copy_to_host(slot, len(data), host_offset=8192)
    assert demote.done() and demote.nbytes == len(data)
    assert arena.buf[8192:8192 + len(data)] == data
    tier.free(slot)

    promoted = tier.allocate(len(data))
    promote = tier.copy_from_host(8192, len(data), promoted)
    promote.wait()
    assert bytes(tier.read(promoted, len(data)).numpy()) == data
    with pytest.raises(ValueError, match="outside"):
        tier.copy_to_host(promoted, len(data), host_offset=arena.size - 10)
    assert tier.export() is None and tier.hello_info() is None  # nothing to share from a CPU pool
    tier.close()


def test_pinning_without_cuda_falls_back_and_never_raises():
    buf = bytearray(1 << 16)
    region = page_lock(buf, len(buf))
    assert not region.locked and region.reason
    region.unlock()  # a no-op
    import numpy as np

    assert buffer_address(buf) == np.frombuffer(buf, dtype=np.uint8).ctypes.data
    limit = memlock_limit()
    assert limit is None or limit >= 0


def test_pool_export_wire_form_is_checked():
    export = PoolExport("GPU-1234", 1 << 30, 0, (0, b"h" * 64, 1 << 30, 0, b"r", 0, b"e", False))
    assert PoolExport.from_wire(export.to_wire()) == export
    with pytest.raises(ValueError, match="malformed"):
        PoolExport.from_wire({"device_uuid": "x", "nbytes": 1, "tensor_offset": 0, "share": [1, 2]})
    assert MappedPool.from_hello(None) is None
    assert MappedPool.from_hello({"device_uuid": "GPU-none"}) is None  # logged, host tier used instead


def test_gpu_mem_is_refused_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible")
    result = run_cli("serve", "--gpu-mem", "1GiB")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "kvstore: error: --gpu-mem needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)"]


def test_paged_cache_chunks_round_trip_through_the_daemon(daemon):
    """Save: gather blocks into a reserved arena slot. Load: scatter a leased view into another cache."""
    layers, blocks, block_size, heads, dim = 2, 8, 16, 2, 16
    source = [torch.randn(2, blocks, block_size, heads, dim) for _ in range(layers)]
    kv = PagedKV.from_vllm(source)
    tokens = list(range(64))
    with daemon.client(namespace="gpu-test", chunk_tokens=32) as client:
        keys = client.chunk_keys(tokens)
        chunks = [gather(kv, [1, 4]), gather(kv, [6, 0])]
        assert client.put(keys, chunks) == 2
        target = [torch.zeros_like(t) for t in source]
        dst = PagedKV.from_vllm(target)
        with client.get(keys) as views:
            for view, ids in zip(views, ([3, 2], [7, 5])):
                chunk = torch.frombuffer(view, dtype=torch.uint8)
                assert load_async(dst, chunk, ids) is None  # CPU: done at once
        for s, t in zip(source, target):
            assert torch.equal(t[:, [3, 2, 7, 5]], s[:, [1, 4, 6, 0]])
        slot = torch.zeros(chunks[0].numel(), dtype=torch.uint8)
        assert save_async(kv, [1, 4], slot) is None
        assert torch.equal(slot, chunks[0])
