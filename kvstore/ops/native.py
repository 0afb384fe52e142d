"""The native kernels' build and load, under the name the kernels and ``python -m kvstore.ops.native`` know. It
lives in ``kvstore/native_libs.py``, which imports no torch, so that the client can load the index walk too; this
module shares its functions and its cache of loaded libraries."""

from __future__ import annotations

from ..native_libs import (BUILD_TIMEOUT_S, SOURCE_DIR, SOURCES, BuildResult, build, cache_dir, forget, load,
                           main)

__all__ = ["BUILD_TIMEOUT_S", "SOURCE_DIR", "SOURCES", "BuildResult", "build", "cache_dir", "forget", "load", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
