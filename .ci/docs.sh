#!/usr/bin/env bash
# Build the documentation site the way CI checks it: `mkdocs build --strict`, so that a broken link or anchor, a
# page missing from the nav's folders or a failing reference generator (docs/hooks/reference.py) fails the
# build. The site goes to a temporary directory, removed afterwards. Needs the docs extra:
#   pip install -e '.[docs]'
# Usage: bash .ci/docs.sh [python]   (default: python)
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${1:-${PYTHON:-python}}"
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --site-dir "$site"
echo "docs: built $(find "$site" -name '*.html' | wc -l) pages"
