"""Where the repository and the test tree are, for tests that read files or run scripts from them."""

from __future__ import annotations

import os

SUPPORT = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(SUPPORT)
ROOT = os.path.dirname(TESTS)
