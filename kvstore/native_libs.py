"""Building and loading the native kernels (``ops/native_src/``), with no hard dependency on them.

This module imports neither torch nor ``kvstore.ops`` (which does), so that the client can load the index walk;
``kvstore.ops.native`` is the same module under the name the kernels use.

The gather/scatter kernels are plain C (``kvstore_copy.c``, OpenMP) and CUDA (``kvstore_copy.cu``), the lookup
index's walk and its writer's placement of new keys plain C (``kvstore_index.c``, ``client/native_walk.py``,
``store/native_place.py``), all with a C ABI, called through
``ctypes`` with raw pointers. They include no torch headers, so a build takes seconds (no ninja, no
``torch/extension.h``) and the library does not depend on which torch build is installed. A build happens only
when asked for (``build()``, ``python -m kvstore.ops.native``, the benchmarks, or ``KVSTORE_NATIVE=build``),
never on import; the sources ship in the package (``kvstore/ops/native_src``, package data of the wheel), so
an installed kvstore builds them as a source checkout does. The result is cached under ``$KVSTORE_NATIVE_DIR`` (default ``~/.cache/kvstore/native``) by a
hash of the source, compiler and flags, and written under a temporary name then renamed, so concurrent builders
never load a half-written library. Without a compiler, sources or CUDA toolkit, loading returns None and the
torch (or Python) path is used.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent / "ops" / "native_src"
CPU_SOURCE = "kvstore_copy.c"
CUDA_SOURCE = "kvstore_copy.cu"
INDEX_SOURCE = "kvstore_index.c"   # the lookup index's walk and placement: plain C, no OpenMP
SOURCES = {"cpu": CPU_SOURCE, "cuda": CUDA_SOURCE, "index": INDEX_SOURCE}
BUILD_TIMEOUT_S = 240


@dataclass(frozen=True)
class BuildResult:
    name: str
    path: str | None
    error: str | None


def cache_dir() -> Path:
    base = os.environ.get("KVSTORE_NATIVE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kvstore", "native")
    return Path(base)


def _cuda_arch() -> str:
    """``sm_XY`` of the visible GPU (``KVSTORE_CUDA_ARCH`` overrides; sm_90 when none is visible)."""
    forced = os.environ.get("KVSTORE_CUDA_ARCH")
    if forced:
        return forced
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001 - no usable CUDA: build for the default target
        pass
    return "sm_90"


def _command(kind: str, source: Path, output: str) -> list[str] | None:
    if kind in ("cpu", "index"):
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        threads = ["-fopenmp"] if kind == "cpu" else []
        return None if cc is None else [cc, "-O3", *threads, "-fPIC", "-shared", "-o", output, str(source)]
    nvcc = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)
    if nvcc is None:
        return None
    arch = _cuda_arch()
    compute = arch.replace("sm_", "compute_")
    return [nvcc, "-O3", "-shared", "-Xcompiler", "-fPIC", f"-gencode=arch={compute},code=[{arch},{compute}]",
            "-o", output, str(source)]


def _library_path(kind: str) -> tuple[Path, list[str]] | None:
    source = SOURCE_DIR / SOURCES[kind]
    if not source.exists():
        return None
    cmd = _command(kind, source, "OUT")
    if cmd is None:
        return None
    digest = hashlib.sha256(source.read_bytes() + " ".join(cmd).encode()).hexdigest()[:16]
    return cache_dir() / f"{Path(SOURCES[kind]).stem}_{kind}_{digest}.so", cmd


def build(kind: str) -> BuildResult:
    """Compile the ``cpu``, ``cuda`` or ``index`` library if it is not cached yet; never raises."""
    found = _library_path(kind)
    if found is None:
        what = "nvcc (a CUDA toolkit)" if kind == "cuda" else "a C compiler"
        return BuildResult(kind, None, f"cannot build: needs {what} and the sources in {SOURCE_DIR}")
    path, cmd = found
    if path.exists():
        return BuildResult(kind, str(path), None)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp.so", dir=path.parent)
        os.close(fd)
        cmd = [tmp if part == "OUT" else part for part in cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            os.unlink(tmp)
            return BuildResult(kind, None, f"{cmd[0]} failed: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    except (OSError, subprocess.SubprocessError) as exc:
        return BuildResult(kind, None, f"build failed: {exc}")
    return BuildResult(kind, str(path), None)


_LOADED: dict[str, ctypes.CDLL | None] = {}


def load(kind: str, build_if_missing: bool | None = None) -> ctypes.CDLL | None:
    """The ``cpu``, ``cuda`` or ``index`` library, or None. Builds only if asked (or ``KVSTORE_NATIVE=build``)."""
    if kind in _LOADED:
        return _LOADED[kind]
    mode = os.environ.get("KVSTORE_NATIVE", "auto").lower()
    lib = None
    if mode != "off":
        if build_if_missing is None:
            build_if_missing = mode == "build"
        found = _library_path(kind)
        if found is not None and (found[0].exists() or (build_if_missing and build(kind).path)):
            lib = _open(kind, str(found[0]))
    _LOADED[kind] = lib
    return lib


def _open(kind: str, path: str) -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    if kind == "index":
        fn = lib.kvstore_index_walk
        fn.argtypes = [ptr, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p, i64, i64, ptr, ptr, ptr]
        fn.restype = i64
        fn = lib.kvstore_index_lookup
        fn.argtypes = [ptr, ctypes.c_uint64, ctypes.c_char_p, i64, i64, i64, i64, ptr]
        fn.restype = i64
        fn = lib.kvstore_index_place
        fn.argtypes = [ptr, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p, ptr, i64, i64, ptr]
        fn.restype = i64
    elif kind == "cpu":
        fn = lib.kvstore_copy_rows_cpu
        fn.argtypes = [ptr, i64, i64, i64, ptr, i64, i64, ptr, ctypes.c_int, ctypes.c_int]
        fn.restype = i64
    else:
        fn = lib.kvstore_copy_rows_cuda
        fn.argtypes = [ptr, i64, i64, i64, ptr, i64, i64, ptr, ctypes.c_int, ctypes.c_int, ptr]
        fn.restype = ctypes.c_int
    return lib


def forget() -> None:
    """Drop what ``load`` remembered (tests and benchmarks that switch ``KVSTORE_NATIVE``)."""
    _LOADED.clear()


def main() -> int:
    kinds = sys.argv[1:] or ["cpu", "index", "cuda"]
    status = 0
    for kind in kinds:
        result = build(kind)
        print(f"{kind}: {result.path or result.error}")
        status |= result.path is None and kind != "cuda"
    return status


if __name__ == "__main__":
    raise SystemExit(main())
