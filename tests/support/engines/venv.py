"""Where the real vLLM engine's virtualenv is: one answer for the tests, the benchmarks and
``.ci/install-vllm-engine.sh`` (which computes the same in shell).

It holds a few GB, so it lives outside the checkout: ``KVSTORE_VLLM_VENV`` when set, else
``${XDG_CACHE_HOME:-~/.cache}/kvstore-dev/venv-vllm``. This module imports nothing beyond the standard library, so
benchmarks can use it without pytest.
"""

from __future__ import annotations

import os
from pathlib import Path

VARIABLE = "KVSTORE_VLLM_VENV"


def venv_dir() -> Path:
    """The engine virtualenv's directory (it may not exist yet)."""
    forced = os.environ.get(VARIABLE)
    if forced:
        return Path(forced)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "kvstore-dev" / "venv-vllm"
