"""kvstore's native code, found and loaded in one place: which paths run in C, and the libraries behind them.

The C sources live in ``native/`` at the top of the source tree and are built when the wheel or the editable
install is built (``setup.py``: plain shared libraries next to this file, called through ``ctypes``):

    _kvstore_index.so   the shared lookup index's walk (``walk.py``, client side) and placement (``place.py``,
                        the daemon's writer), plain C
    _kvstore_copy.so    the host gather/scatter of paged KV (``copy.py``), C with OpenMP

Nothing is compiled at run time: a library that was not built (no compiler when the package was built) or
does not load is absent, and its callers run the Python (or torch) path, with the same answers. The CUDA
gather/scatter kernel is the exception that cannot be built ahead of time without knowing the GPU: ``cuda.py``
compiles it through cupy on first use, into a cache directory (``cuda_cache_dir``).

``KVSTORE_NATIVE=off`` turns every native path off (the Python paths run), for comparisons and tests.
``paths()`` names what is native in this process; the daemon's ``ready`` line and ``kvstore stats`` show it.

This module imports neither torch nor cupy, so the daemon, the CLI and the client can use it.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from ..errors import ConfigError

HERE = Path(__file__).resolve().parent
LIBRARIES = {"index": "_kvstore_index.so", "copy": "_kvstore_copy.so"}
INDEX_ABI = 2   # native/kvstore_index.c's kvstore_index_abi(): a library built from other sources is not used

_LOADED: dict[str, ctypes.CDLL | None] = {}


def enabled() -> bool:
    """Whether native paths may be used at all: ``KVSTORE_NATIVE`` is ``auto`` (the default: where built) or ``off``.

    Raises:
        ConfigError: any other value.
    """
    value = os.environ.get("KVSTORE_NATIVE", "").strip().lower()
    if value in ("", "auto", "off"):
        return value != "off"
    hint = " (nothing is built at run time: the install builds the native code)" if value == "build" else ""
    raise ConfigError(f"KVSTORE_NATIVE={value!r}{hint}: set it to auto or off, or unset it")


def library_path(kind: str) -> Path:
    """Where the ``index`` or ``copy`` library is when it was built (it may be absent)."""
    return HERE / LIBRARIES[kind]


def load(kind: str) -> ctypes.CDLL | None:
    """The built ``index`` or ``copy`` library with its functions' signatures set, or None (not built, does not
    load, or ``KVSTORE_NATIVE=off``). Remembered per process; ``forget`` drops what was remembered.

    Raises:
        ValueError: ``kind`` names no library.
        ConfigError: ``KVSTORE_NATIVE`` holds a value other than auto or off.
    """
    if kind not in LIBRARIES:
        raise ValueError(f"unknown native library {kind!r}; choose one of {sorted(LIBRARIES)}")
    if kind not in _LOADED:
        path = library_path(kind)
        _LOADED[kind] = _open(kind, path) if enabled() and path.exists() else None
    return _LOADED[kind]


def paths() -> list[str]:
    """The native paths this process can use, in a fixed order (``index``, ``copy``); empty when none."""
    return [kind for kind in LIBRARIES if load(kind) is not None]


def describe() -> str:
    """``paths()`` as one word for a log line or the stats: ``index,copy``, ``index`` or ``none``."""
    return ",".join(paths()) or "none"


def forget() -> None:
    """Drop what ``load`` remembered (for tests and benchmarks that switch ``KVSTORE_NATIVE``)."""
    _LOADED.clear()


def _open(kind: str, path: Path) -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:   # built for another machine, or a library it needs (libgomp) is missing: the Python path
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    if kind == "index":
        if not _index_abi_is(lib, INDEX_ABI):   # an older build left in place: the Python path
            return None
        fn = lib.kvstore_index_walk
        fn.argtypes = [ptr, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p, i64, i64, ptr, ptr, ptr,
                       ctypes.c_uint64]
        fn.restype = i64
        fn = lib.kvstore_index_lookup
        fn.argtypes = [ptr, ctypes.c_uint64, ctypes.c_char_p, i64, i64, i64, i64, ptr, ctypes.c_uint64]
        fn.restype = i64
        fn = lib.kvstore_index_place
        fn.argtypes = [ptr, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p, ptr, i64, i64, ptr]
        fn.restype = i64
    else:
        fn = lib.kvstore_copy_rows_cpu
        fn.argtypes = [ptr, i64, i64, i64, ptr, i64, i64, ptr, ctypes.c_int, ctypes.c_int]
        fn.restype = i64
    return lib


def _index_abi_is(lib: ctypes.CDLL, abi: int) -> bool:
    """Whether the index library was built from the sources this package expects (``INDEX_ABI``)."""
    try:
        fn = lib.kvstore_index_abi
    except AttributeError:
        return False
    fn.argtypes, fn.restype = [], ctypes.c_int64
    return bool(fn() == abi)


def cuda_source() -> Path | None:
    """The CUDA kernel's source: shipped in the package by the wheel, or ``native/`` of a source checkout."""
    for candidate in (HERE / "kvstore_copy.cu", HERE.parent.parent / "native" / "kvstore_copy.cu"):
        if candidate.is_file():
            return candidate
    return None


def cuda_cache_dir() -> Path:
    """Where cupy keeps the compiled CUDA kernel: ``$KVSTORE_NATIVE_DIR``, else systemd's ``CacheDirectory=``
    (``$CACHE_DIRECTORY``, writable under ``ProtectHome=yes``), else ``$XDG_CACHE_HOME/kvstore/cuda``."""
    forced = os.environ.get("KVSTORE_NATIVE_DIR")
    if forced:
        return Path(forced)
    systemd = os.environ.get("CACHE_DIRECTORY")
    if systemd:
        return Path(systemd.split(":")[0]) / "cuda"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvstore" / "cuda"
