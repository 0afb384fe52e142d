"""The pytest fixtures of the real vLLM engine test modules, over ``harness/engines/vllm_real.py``'s ``POOL``.

A test module imports them by name (which is how pytest finds them): ``engine_venv`` then applies to every test
of the module, ``pool`` is the session's engines.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from harness.engines.vllm_real import POOL, EnginePool, require_engine


@pytest.fixture(scope="module", autouse=True)
def engine_venv() -> str:
    """Every test of a module that imports this needs the engine virtualenv (skip, or fail under CI)."""
    return require_engine()


@pytest.fixture(scope="session")
def pool() -> Iterator[EnginePool]:
    """The session's engines; closed (and their directory removed) at the end."""
    yield POOL
    POOL.close()
