#!/usr/bin/env bash
# The lint gate: `ruff check` over the tree and `mypy` over kvstore/ and connectors/, with the settings in
# pyproject.toml ([tool.ruff], [tool.mypy]). Exits non-zero on any finding. Needs the dev extra:
#   pip install -e '.[dev]'
# Usage: bash .ci/lint.sh [python]   (default: $PYTHON, else python)
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${1:-${PYTHON:-python}}"
status=0
"$PY" -m ruff check . || status=1
"$PY" -m mypy || status=1
if [ "$status" -eq 0 ]; then echo "lint: clean"; fi
exit "$status"
