"""The harness the tests and the benchmarks share: kvstore daemons in sandboxes of their own (``daemons``), real
Redis and Mooncake servers (``servers``), the verifying workload and its crash checks (``workload``,
``crashes``), the real engines, their virtualenvs and home directories (``engines``), what ``/proc`` says about
processes (``procfs``) and the one way to wait (``wait``).

Run from the repository root (pytest's ``pythonpath`` and ``python -m bench.NAME`` both put it on the path); it
is not installed with the package. Test-only helpers stay in ``tests/support``. Within this package, modules
import each other relatively (``from .procfs import``).
"""

import os

# The user's own cache directory as it was when the harness was first imported: before the test session points
# XDG_CACHE_HOME into its sandbox (tests/conftest.py). The engine virtualenvs live under it (engines/venv.py).
USER_XDG_CACHE_HOME = os.environ.get("XDG_CACHE_HOME", "")
