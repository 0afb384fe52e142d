"""The CUDA gather/scatter kernel (``native/kvstore_copy.cu``), compiled through cupy where a GPU is used.

The kernel cannot be built with the wheel without knowing the GPU it will run on, and a subprocess ``nvcc`` at
run time is what a hardened deployment cannot have (no toolkit, no writable home). So the source ships in the
package and cupy's ``RawModule`` compiles it with NVRTC, in-process, the first time a paged cache on a GPU is
copied; cupy keeps the result in its kernel cache, which is pointed at ``kvstore.native.cuda_cache_dir()``
(a directory the daemon may write under systemd) unless ``CUPY_CACHE_DIR`` already says where. Without cupy
(``pip install 'kvstore[gpu]'``), or if the compile fails, ``module()`` is None and the torch path runs.

``plan`` is the launch's shape, kept apart from the launch so that it can be checked without a GPU.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from . import cuda_cache_dir, cuda_source, enabled

VEC16 = "kvstore_copy_rows_vec16"   # 16-byte loads and stores: every address and the row size 16-byte aligned
BYTES = "kvstore_copy_rows_bytes"   # a byte at a time: anything else
KERNELS = (VEC16, BYTES)
MAX_GRID_Y = 65535                  # CUDA's limit on gridDim.y, the number of planes one launch can cover


@dataclass(frozen=True)
class Launch:
    """One kernel launch: which kernel, its grid (rows, planes), threads per block, and the row's length in the
    kernel's units (16-byte vectors or bytes)."""

    kernel: str
    grid: tuple[int, int]
    threads: int
    row_units: int


def plan(rows: int, planes: int, row_bytes: int, vec16: bool) -> Launch | None:
    """The launch copying ``rows`` rows of ``row_bytes`` in each of ``planes`` planes, or None (nothing to copy).

    Raises:
        ValueError: more planes than one launch's grid can hold.
    """
    if rows == 0 or planes == 0:
        return None
    if planes > MAX_GRID_Y:
        raise ValueError(f"{planes} planes: one CUDA launch covers at most {MAX_GRID_Y}")
    if vec16:
        units = row_bytes // 16
        # enough threads to keep a long row's loads in flight, fewer for a short row (idle threads cost a slot)
        threads = 512 if units >= 512 else (128 if units >= 128 else 32)
        return Launch(VEC16, (rows, planes), threads, units)
    return Launch(BYTES, (rows, planes), 256, row_bytes)


class CudaKernels:
    """The compiled kernels, per device (cupy compiles for the device current at the first call there)."""

    def __init__(self, cupy: Any, module: Any) -> None:
        self._cupy = cupy
        self._module = module
        self._functions: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def functions(self, device: int) -> dict[str, Any]:
        """The kernels on ``device``, compiled (or read from cupy's cache) on first use there.

        Raises:
            RuntimeError: the kernel did not compile.
        """
        found = self._functions.get(device)
        if found is not None:
            return found
        with self._lock, self._cupy.cuda.Device(device), _cupy_cache_dir():
            try:
                found = {name: self._module.get_function(name) for name in KERNELS}
                for kernel in found.values():
                    _ = kernel.kernel   # compiles (or reads cupy's cache) for this device now, in kvstore's cache dir
            except Exception as exc:
                raise RuntimeError(f"the CUDA gather/scatter kernel did not compile: {exc}") from exc
            self._functions[device] = found
        return found

    def copy_rows(self, launch: Launch, device: int, stream: int, args: tuple[int, ...]) -> None:
        """Run ``launch`` on ``device`` and the CUDA stream ``stream`` (a raw ``cudaStream_t``). ``args``: the
        plane table's address, row stride, index address, rows, number of blocks, chunk address, to_chunk.

        Raises:
            RuntimeError: the launch failed.
        """
        import numpy as np

        ptrs, row_stride, index, rows, num_blocks, chunk, to_chunk = args
        fn = self.functions(device)[launch.kernel]
        # cupy packs each argument by its numpy type: pointers as 8-byte words, `int to_chunk` as 4 bytes
        packed = (np.uint64(ptrs), np.int64(row_stride), np.int64(launch.row_units), np.uint64(index),
                  np.int64(rows), np.int64(num_blocks), np.uint64(chunk), np.int32(to_chunk))
        try:
            with self._cupy.cuda.Device(device):
                fn(launch.grid, (launch.threads,), packed, stream=self._cupy.cuda.ExternalStream(stream))
        except Exception as exc:
            raise RuntimeError(f"native CUDA gather/scatter failed to launch: {exc}") from exc


_STATE: dict[str, CudaKernels | None] = {}


def module() -> CudaKernels | None:
    """The kernels (not yet compiled for any device), or None: ``KVSTORE_NATIVE=off``, no cupy, no source."""
    if "kernels" not in _STATE:
        _STATE["kernels"] = _open() if enabled() else None
    return _STATE["kernels"]


def forget() -> None:
    """Drop what ``module`` remembered."""
    _STATE.clear()


def _open() -> CudaKernels | None:
    source = cuda_source()
    try:
        import cupy
    except ImportError:
        return None
    if source is None:
        return None
    code = source.read_text()
    return CudaKernels(cupy, cupy.RawModule(code=code, options=("-std=c++14",), backend="nvrtc"))


@contextmanager
def _cupy_cache_dir() -> Iterator[None]:
    """cupy's kernel cache in kvstore's cache directory while the kernel compiles, unless ``CUPY_CACHE_DIR`` is
    set already (cupy reads it when it compiles; it is put back after, so other cupy users are not moved)."""
    if "CUPY_CACHE_DIR" in os.environ:
        yield
        return
    where = cuda_cache_dir()
    where.mkdir(parents=True, exist_ok=True)
    os.environ["CUPY_CACHE_DIR"] = str(where)
    try:
        yield
    finally:
        os.environ.pop("CUPY_CACHE_DIR", None)
