"""Where the real engines' virtualenvs are: one answer for the tests, the benchmarks and
``.ci/install-vllm-engine.sh`` / ``.ci/install-sglang-engine.sh`` (which compute the same in shell).

It holds a few GB, so it lives outside the checkout: ``KVSTORE_VLLM_VENV`` when set, else
``${XDG_CACHE_HOME:-~/.cache}/kvstore-dev/venv-vllm`` of the user running the tests. The test session points
``XDG_CACHE_HOME`` into its sandbox, so the user's own value is the one read when the helpers were first
imported (``support.USER_XDG_CACHE_HOME``). This module imports nothing beyond the standard library and its
package, so benchmarks can use it without pytest.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# each engine's variable; its default folder is venv-<engine>
VARIABLES = {"vllm": "KVSTORE_VLLM_VENV", "sglang": "KVSTORE_SGLANG_VENV"}
VARIABLE = VARIABLES["vllm"]


def venv_dir(env: Mapping[str, str] | None = None, engine: str = "vllm") -> Path:
    """The `engine`'s virtualenv directory (it may not exist yet), for ``env`` (default: this process's
    environment, with the user's own ``XDG_CACHE_HOME``)."""
    if env is None:
        from .. import USER_XDG_CACHE_HOME

        env = {**os.environ, "XDG_CACHE_HOME": USER_XDG_CACHE_HOME}
    forced = env.get(VARIABLES[engine])
    if forced:
        return Path(forced)
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(cache) / "kvstore-dev" / f"venv-{engine}"


TITLES = {"vllm": "vLLM", "sglang": "SGLang"}
EXTRAS_COMMAND = "bash .ci/install-extras.sh"   # every extra the test command skips without, the engines too


def engine_python(engine: str = "vllm") -> str | None:
    """The `engine` virtualenv's python, or None when there is none (or it lacks the engine's package)."""
    venv = venv_dir(engine=engine)
    python = venv / "bin" / "python"
    if not python.exists() or not list(venv.glob(f"lib/python*/site-packages/{engine}/__init__.py")):
        return None
    return str(python)


def skip_reason(engine: str = "vllm") -> str:
    """Why the `engine`'s tests do not run here, and the command that makes them run."""
    return (f"no {TITLES[engine]} engine virtualenv at {venv_dir(engine=engine)} ({VARIABLES[engine]} names "
            f"another): `{EXTRAS_COMMAND}` installs it (or `bash .ci/install-{engine}-engine.sh` alone)")


def require_engine(engine: str = "vllm") -> str:
    """The `engine` virtualenv's python; else skip the test (fail it where extras are required: CI)."""
    import pytest

    from ..servers import extras_required

    python = engine_python(engine)
    if python is None:
        if extras_required():
            pytest.fail(skip_reason(engine) + " -- required when CI is set", pytrace=False)
        pytest.skip(skip_reason(engine))
    return python
