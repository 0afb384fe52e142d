"""Helpers shared by the test modules: daemon starters, real servers, workloads, engine harnesses.

Test modules import from here (``from support.daemons import run_cli``); no test module imports another.
The benchmarks import the same modules as ``tests.support`` (``from tests.support.daemons import Daemons``), run
from the repository root; so within this package, modules import each other relatively (``from .hygiene import``).
"""

import os

# The user's own cache directory as it was when the helpers were first imported: before the test session points
# XDG_CACHE_HOME into its sandbox (conftest.py). The engine virtualenv lives under it (engines/venv.py).
USER_XDG_CACHE_HOME = os.environ.get("XDG_CACHE_HOME", "")
