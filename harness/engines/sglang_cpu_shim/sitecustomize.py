"""SGLang's CPU kernels that its CPU engine path calls but no package on the index provides, as PyTorch.

Put this directory on ``PYTHONPATH`` of an SGLang engine started with ``SGLANG_USE_CPU_ENGINE=1``; Python
imports ``sitecustomize`` at start-up in every process the engine spawns, and this one then supplies:

* ``sgl_kernel.assign_req_to_token_pool_cpu`` (the CPU build of sgl-kernel, ``sgl-kernel/csrc/cpu``, is not on
  the package index; the engine's allocator imports it on CPU) -- only when no real ``sgl_kernel`` is installed;
* ``transfer_kv_direct`` in ``sglang.srt.mem_cache.pool_host.mha`` and ``.mla`` (bound there only on CUDA, ROCm
  and XPU), which HiCache's ``direct`` I/O backend calls to move pages of the ``layer_first`` host layout;
* ``pin_memory=False`` for every HiCache host pool (pinning host memory calls the CUDA driver);
* process groups without PyNccl or the custom all-reduce (both enter a CUDA device; at ``--tp 2`` and above
  the groups then all-reduce over gloo).

Without ``SGLANG_USE_CPU_ENGINE=1`` nothing here runs.
"""

from __future__ import annotations

import os

if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
    import sglang_cpu_kernels  # type: ignore[import-not-found]  # this folder is on PYTHONPATH, not a package

    sglang_cpu_kernels.install()
