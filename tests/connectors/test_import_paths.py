"""The engine connectors keep their import path, ``kvstore.connectors.<engine>``, from the top-level connectors/.

Users name ``kvstore.connectors.vllm`` in their vLLM configs and import ``kvstore.connectors.sglang`` / ``.hf``;
the sources live in ``connectors/``. Both ways of running kvstore are checked: a checkout on ``PYTHONPATH`` (as
the tests and the engine venv run it) and a built wheel installed into a scratch venv.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

CHECKOUT = pathlib.Path(__file__).resolve().parents[2]
ENGINE_MODULES = ("kvstore.connectors.vllm", "kvstore.connectors.sglang", "kvstore.connectors.hf",
                  "kvstore.connectors.vllm.scheduler", "kvstore.connectors.vllm.worker",
                  "kvstore.connectors.common.store")
# Prints where each module would load from; imports hf for real (torch and transformers are in the test venv).
# The engines' own packages may be absent, so nothing of kvstore.connectors.vllm or .sglang is executed: a
# submodule is looked for in its package's folder, which importing the package (and so the engine) would need.
PROBE = f"""
import importlib.machinery, importlib.util, kvstore.connectors.hf
for name in {ENGINE_MODULES!r}:
    package, _, leaf = name.rpartition(".")
    if package == "kvstore.connectors":
        print(importlib.util.find_spec(name).origin)
    else:
        folders = importlib.util.find_spec(package).submodule_search_locations
        print(importlib.machinery.PathFinder.find_spec(name, folders).origin)
"""


def _origins(python: str, cwd: pathlib.Path, env: dict[str, str]) -> list[pathlib.Path]:
    out = subprocess.run([python, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [pathlib.Path(line) for line in out.stdout.split()]


def test_checkout_on_pythonpath_loads_the_top_level_folder(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    origins = _origins(sys.executable, tmp_path, env)
    assert len(origins) == len(ENGINE_MODULES)
    assert all(o.is_relative_to(CHECKOUT / "connectors") for o in origins), origins


@pytest.mark.timeout(600)
def test_wheel_installs_the_connectors_under_kvstore(tmp_path: pathlib.Path) -> None:
    wheels, site, src = tmp_path / "wheels", tmp_path / "site", tmp_path / "src"
    # built from a copy, so that no build/ or egg-info lands in the checkout
    for top in ("kvstore", "connectors", "native"):
        shutil.copytree(CHECKOUT / top, src / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy(CHECKOUT / name, src)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels), str(src)], check=True, cwd=tmp_path, timeout=300,
                   env={**os.environ, "CC": "false"})
    (wheel,) = wheels.glob("kvstore-*.whl")
    # a scratch install location ahead of this interpreter's own (which holds the dependencies)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site),
                    str(wheel)], check=True, timeout=300)
    origins = _origins(sys.executable, tmp_path, {**os.environ, "PYTHONPATH": str(site)})
    assert len(origins) == len(ENGINE_MODULES)
    assert all(o.is_relative_to(site / "kvstore" / "connectors") for o in origins), origins
    assert not (site / "connectors").exists()   # nothing installed under a top-level name of its own
