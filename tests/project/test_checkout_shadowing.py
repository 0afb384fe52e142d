"""A user's script run from the parent of a checkout named ``kvstore`` (issue 40, item 8).

Python looks in the script's directory first, so ``import kvstore`` there finds the checkout's folder. Without the
checkout's root ``__init__.py`` that folder is an empty namespace package (``module 'kvstore' has no attribute
'connect'``); with it, the installed package is loaded in its place and one warning names the folder, and where
no package is installed the import fails with one line that says how to fix it. Each case runs a real
interpreter in a copy of the checkout's root laid out as a user's clone is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support.paths import ROOT


@pytest.fixture
def parent(tmp_path) -> str:
    """A directory holding a checkout named ``kvstore`` (its root files; the package is the installed one)."""
    checkout = tmp_path / "kvstore"
    checkout.mkdir()
    for name in ("__init__.py", "pyproject.toml", "README.md", "setup.py"):
        if os.path.exists(os.path.join(ROOT, name)):
            shutil.copy(os.path.join(ROOT, name), checkout / name)
    return str(tmp_path)


def _python(parent: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=parent, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})


@pytest.mark.parametrize("how", ["-c", "script"])
def test_the_installed_package_is_loaded_and_the_folder_named(parent, how):
    code = "import kvstore\nprint(kvstore.__file__)\nprint(kvstore.connect.__name__)\n"
    if how == "script":
        with open(os.path.join(parent, "use_kvstore.py"), "w") as f:
            f.write(code)
        done = _python(parent, "use_kvstore.py")
    else:
        done = _python(parent, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [os.path.join(ROOT, "kvstore", "__init__.py"), "connect"]
    warning = next(line for line in done.stderr.splitlines() if "UserWarning" in line)
    assert f"the folder {os.path.join(parent, 'kvstore')}, a kvstore source checkout" in warning, done.stderr
    assert f"loaded {os.path.join(ROOT, 'kvstore')} instead. Run from another directory" in warning


def test_with_no_package_installed_the_import_says_how_to_fix_it(parent):
    done = _python(parent, "-S", "-E", "-c", "import kvstore")   # no site-packages, no PYTHONPATH: nothing installed
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    checkout = os.path.join(parent, "kvstore")
    assert last.startswith(f"ImportError: 'import kvstore' found the folder {checkout}, a kvstore source "
                           f"checkout, not the package, and no kvstore package is installed"), done.stderr
    assert f"pip install -e {checkout}` and run from another directory" in last
