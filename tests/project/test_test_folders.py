"""Test folders never shadow a real module.

pytest puts each test folder that is not a package on ``sys.path`` (its default "prepend" import mode), so a
folder or module under it named like a real package is imported in that package's place: a folder
``tests/connectors/vllm`` once made ``import vllm`` find the tests, and every vLLM test failed to collect on a
machine without vLLM.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# what the tests, the connectors and the benchmarks import, installed here or not. tests/bench and
# tests/connectors are namespace folders beside the checkout's own: bench/ is a regular package, which wins over
# them, and connectors/ is imported only as kvstore.connectors.
ALWAYS = {"vllm", "sglang", "transformers", "torch", "peft", "redis", "mooncake", "msgspec", "zmq", "kvstore", "hf"}


def real_module_names() -> set[str]:
    return ALWAYS | set(sys.stdlib_module_names) | set(importlib.metadata.packages_distributions())


def names_on_the_path() -> dict[str, Path]:
    """Every name importable from a test folder that pytest puts on sys.path: its sub-folders and modules."""
    found: dict[str, Path] = {}
    for folder, subfolders, files in os.walk(TESTS):
        here = Path(folder)
        if (here / "__init__.py").exists() or "__pycache__" in here.parts:
            continue
        for name in subfolders:
            if name != "__pycache__":
                found[name] = here / name
        for name in files:
            if name.endswith(".py") and name not in ("conftest.py", "__init__.py"):
                found[name[:-3]] = here / name
    return found


def test_no_test_folder_or_module_is_named_like_a_real_module():
    real = real_module_names()
    shadowing = {name: str(path.relative_to(TESTS)) for name, path in names_on_the_path().items() if name in real}
    assert not shadowing, f"rename these (pytest would import them in place of the real module): {shadowing}"


def test_every_module_the_markers_name_exists():
    """conftest.py marks modules by path (engine, process, GPU): a moved module would silently lose its marker."""
    import conftest

    named = conftest.PROCESS_MODULES | conftest.ENGINE_MODULES | conftest.GPU_MODULES
    missing = sorted(path for path in named if not (TESTS / path).is_file())
    assert not missing, f"conftest.py names modules that are not there: {missing}"
