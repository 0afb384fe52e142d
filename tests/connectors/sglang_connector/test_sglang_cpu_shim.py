"""The CPU stand-ins the SGLang engine tests put on the server's PYTHONPATH (harness/engines/sglang_cpu_shim)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from harness.engines.sglang_real import SHIM

KERNELS = SHIM / "sglang_cpu_kernels.py"


@pytest.fixture(scope="module")
def kernels():
    spec = importlib.util.spec_from_file_location("sglang_cpu_kernels_under_test", KERNELS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_assign_req_to_token_pool_writes_each_requests_slots_into_its_row(kernels):
    table = torch.full((4, 10), -1, dtype=torch.int32)
    rows = torch.tensor([2, 0])
    start, end = torch.tensor([3, 0]), torch.tensor([6, 2])
    slots = torch.tensor([40, 41, 42, 7, 8], dtype=torch.int64)     # request 0's three, then request 1's two
    kernels.assign_req_to_token_pool_cpu(rows, table, start, end, slots, table.shape[1])
    assert table[2, 3:6].tolist() == [40, 41, 42]
    assert table[0, 0:2].tolist() == [7, 8]
    assert int((table != -1).sum()) == 5   # nothing else written


def test_transfer_kv_direct_copies_rows_between_index_sets(kernels):
    src = [torch.randn(32, 2, 4), torch.randn(32, 2, 4)]
    dst = [torch.zeros(64, 2, 4), torch.zeros(64, 2, 4)]
    src_idx, dst_idx = torch.arange(16, 32), torch.arange(48, 64)
    kernels.transfer_kv_direct(src, dst, src_idx, dst_idx, page_size=16)
    for s, d in zip(src, dst):
        assert torch.equal(d[48:64], s[16:32])
        assert not d[:48].any()


def test_sgl_kernel_stand_in_names_an_op_it_does_not_have(kernels):
    module = kernels._kernel_module()
    assert module.assign_req_to_token_pool_cpu is kernels.assign_req_to_token_pool_cpu
    with pytest.raises(NotImplementedError, match="copy_all_layer_kv_cache_cpu"):
        module.copy_all_layer_kv_cache_cpu()
    assert "sgl_kernel" not in sys.modules or sys.modules["sgl_kernel"] is not module
