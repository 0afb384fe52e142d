"""The root of a kvstore source checkout: not the kvstore package (that is ``kvstore/`` below this file).

Python runs this file only when the checkout's folder is named ``kvstore`` and the directory holding it comes
first on ``sys.path``: a script, ``python -c`` or ``python -m`` run from the checkout's parent. Without it the
folder would be imported as an empty namespace package that hides the installed one (``module 'kvstore' has no
attribute 'connect'``). So it loads the installed package in its own place, with one warning that names the
folder; when none is installed, the import fails with one line that says how to fix it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings


def _installed_package() -> object:
    """The kvstore package that Python finds with the checkout's parent directory left out of ``sys.path``."""
    checkout = os.path.dirname(os.path.abspath(__file__))
    parent = os.path.realpath(os.path.dirname(checkout))
    saved = list(sys.path)
    this = sys.modules.pop(__name__)
    sys.path[:] = [p for p in saved if os.path.realpath(p or os.curdir) != parent]
    try:
        spec = importlib.util.find_spec(__name__)
        if spec is None or spec.origin is None or os.path.realpath(spec.origin) == os.path.realpath(__file__):
            sys.modules[__name__] = this
            raise ImportError(f"'import {__name__}' found the folder {checkout}, a kvstore source checkout, not the "
                              f"package, and no kvstore package is installed for {sys.executable}: run from inside "
                              f"the checkout, or `pip install -e {checkout}` and run from another directory")
        package = importlib.import_module(__name__)
    finally:
        sys.path[:] = saved
    warnings.warn(f"the folder {checkout}, a kvstore source checkout in the directory Python searches first, hides "
                  f"the installed kvstore package; loaded {os.path.dirname(str(spec.origin))} instead. Run from "
                  f"another directory to leave the folder out", stacklevel=3)
    return package


if __name__ == "kvstore":   # not when a tool imports the file by its path (pytest, as ``__init__``)
    _installed_package()   # now sys.modules[__name__]: the import statement that ran this file returns it
