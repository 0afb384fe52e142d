"""The PyTorch stand-ins that ``sitecustomize`` installs for SGLang's CPU engine (see its docstring)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any, Callable, Sequence

import torch


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """Write each request's new KV slots into its row of the request-to-token table.

    Request ``i`` owns row ``req_pool_indices[i]``; its positions ``[start_offset[i], end_offset[i])`` get the
    next ``end - start`` entries of ``out_cache_loc``, which holds the slots of all requests back to back.
    """
    taken = 0
    rows, starts, ends = req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()
    for row, start, end in zip(rows, starts, ends):
        count = end - start
        req_to_token[row, start:end] = out_cache_loc[taken:taken + count].to(req_to_token.dtype)
        taken += count


def transfer_kv_direct(src_layers: Sequence[torch.Tensor], dst_layers: Sequence[torch.Tensor],
                       src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int) -> None:
    """Copy the token rows ``src_indices`` of each source layer buffer to the rows ``dst_indices`` of its pair.

    The buffers are token-major (``[tokens, ...]``), device and host alike in the ``layer_first`` layout;
    ``page_size`` only tells the CUDA kernel how the indices group into pages.
    """
    for src, dst in zip(src_layers, dst_layers):
        rows = src.index_select(0, src_indices.to(src.device, torch.int64))
        dst.index_copy_(0, dst_indices.to(dst.device, torch.int64), rows.to(dst.device))


def _unpinned_host_pools(module: types.ModuleType) -> None:
    """Every HiCache host pool (they share ``HostKVCache.__init__``) allocates plain, unpinned memory."""
    base = module.HostKVCache
    init = base.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["pin_memory"] = False
        init(self, *args, **kwargs)

    base.__init__ = __init__


def _bind_transfer_kv_direct(module: types.ModuleType) -> None:
    if not hasattr(module, "transfer_kv_direct"):
        module.transfer_kv_direct = transfer_kv_direct  # type: ignore[attr-defined]


def _no_nccl_groups(module: types.ModuleType) -> None:
    """Process groups without NCCL or the CUDA all-reduce: 0.5.23 turns PyNccl on for a group of more than one
    rank on every platform but NPU and XPU, and its communicator enters a CUDA device (TP > 1 fails at start on
    CPU). The CPU path then all-reduces over the groups' gloo backend, as it does on a CPU without AMX."""
    make = module.init_model_parallel_group

    def init_model_parallel_group(*args: Any, **kwargs: Any) -> Any:
        for flag in ("use_pynccl", "use_custom_allreduce"):
            if kwargs.get(flag) is None:
                kwargs[flag] = False
        return make(*args, **kwargs)

    module.init_model_parallel_group = init_model_parallel_group  # type: ignore[attr-defined]


# module name -> what to do to it once it has run
AFTER_IMPORT: dict[str, Callable[[types.ModuleType], None]] = {
    "sglang.srt.mem_cache.pool_host.base": _unpinned_host_pools,
    "sglang.srt.mem_cache.pool_host.mha": _bind_transfer_kv_direct,
    "sglang.srt.mem_cache.pool_host.mla": _bind_transfer_kv_direct,
    "sglang.srt.distributed.parallel_state": _no_nccl_groups,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the modules of ``AFTER_IMPORT`` as usual and runs their patch right after each has executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        patch = AFTER_IMPORT.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            execute(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _missing_op(name: str) -> Callable[..., None]:
    def op(*args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"sgl_kernel.{name} has no CPU stand-in in harness/engines/sglang_cpu_shim; "
                                  "this engine path needs the CPU build of sgl-kernel")

    op.__name__ = name
    return op


def _kernel_module() -> types.ModuleType:
    """A stand-in ``sgl_kernel``: the CPU op the engine path calls, and a stub that raises for any other name.

    SGLang's modules import their CPU ops by name at import time (``from sgl_kernel import ...`` under
    ``is_cpu()``) whether or not the engine path ever calls them; the stubs let those imports pass and make a
    call that would need the real kernel fail with its name.
    """
    module = types.ModuleType("sgl_kernel")
    module.__doc__ = "CPU stand-ins for sgl-kernel ops (harness/engines/sglang_cpu_shim)."
    module.assign_req_to_token_pool_cpu = assign_req_to_token_pool_cpu  # type: ignore[attr-defined]

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing_op(name)

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


def install() -> None:
    """Install the stand-ins (idempotent)."""
    if any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    if "sgl_kernel" not in sys.modules and importlib.util.find_spec("sgl_kernel") is None:
        sys.modules["sgl_kernel"] = _kernel_module()
    sys.meta_path.insert(0, _AfterImport())
