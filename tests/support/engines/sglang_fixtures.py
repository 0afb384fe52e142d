"""The pytest fixtures of the real SGLang engine test modules (``harness/engines/sglang_real.py`` starts the
servers), imported there by name, which is how pytest finds them: the engine's python, the module's directory and
its daemon."""

from __future__ import annotations

import shutil
from typing import Any, Iterator

import pytest

from harness.daemons import keep_dirs, short_tempdir
from harness.engines.sglang_real import require_engine


@pytest.fixture(scope="module")
def engine_venv() -> str:
    """The engine virtualenv's python (skip, or fail under CI, without it)."""
    return require_engine()


@pytest.fixture(scope="module")
def engine_workdir(engine_venv: str) -> Iterator[str]:
    """A short directory of the module's own: the daemon's socket, the model, the engine's logs and HOME."""
    path = short_tempdir("sgl-")
    yield path
    if not keep_dirs():
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def kv_daemon(start_module_daemon: Any, engine_workdir: str) -> Any:
    """The module's daemon, on the socket its engines are configured with."""
    return start_module_daemon("--host-mem", "256MiB", workdir=engine_workdir)
