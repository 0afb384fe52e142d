#!/usr/bin/env bash
# Install a real SGLang engine (its CPU path) in a virtualenv of its own, for tests/connectors/sglang_connector/test_sglang_engine*.py.
#
# SGLang pins CUDA builds of everything, so the engine and xgrammar go in with --no-deps, after SGLang's own
# torch and torchvision pins (it imports torchvision at start; the index's torchvision fails beside the 2.13 CPU
# torch the test python has, hence a virtualenv of its own). Then the runtime dependencies an engine start on
# the CPU path imports, by name, and what kvstore imports at run time (the engine imports the backend from the
# source tree through PYTHONPATH). The CPU build of sgl-kernel is not on the package index: the few CPU kernels
# the engine path calls come from harness/engines/sglang_cpu_shim (see docs/connectors/sglang.md).
#
# Idempotent: a virtualenv whose sglang, torch and dependencies are already there is only import-checked.
# Usage: bash .ci/install-sglang-engine.sh
#   KVSTORE_SGLANG_VENV: where (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvstore-dev/venv-sglang, outside the checkout)
set -euo pipefail
SCRIPT="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."

VENV="${KVSTORE_SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvstore-dev/venv-sglang}"
PY_BASE="${PYTHON:-python3.11}"
command -v "$PY_BASE" >/dev/null || PY_BASE=python3
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
TORCH_VERSION="${TORCH_VERSION:-2.14.1}"
TORCHVISION_VERSION="${TORCHVISION_VERSION:-0.29.1}"
# What `python -m sglang.launch_server --device cpu` imports on the way to serving a Llama or DeepSeek model
# (SGLang's pins where it pins them), plus what it loads at start without declaring it.
RUNTIME_DEPS=(
  "transformers==5.19.0" "tokenizers==0.23.2" "compressed-tensors==0.18.0" "openai==2.8.0" "openai-harmony==0.0.4"
  "llguidance>=1.7.6,<2" "apache-tvm-ffi==0.1.11"
  fastapi uvicorn uvloop orjson pybase64 pydantic python-multipart requests aiohttp msgspec psutil setproctitle
  sentencepiece tqdm partial-json-parser einops interegular packaging regex gguf zstandard watchfiles jsonschema
  IPython dill soundfile
)
KVSTORE_DEPS=(pyzmq msgpack xxhash lz4 prometheus-client rich numpy)
# For bench/serve_sglang.py: Mooncake Store's client (CUDA-free build, as .ci/install-peers.sh installs for the
# remote-tier tests), which SGLang's `mooncake` storage backend imports in the engine.
# And SGLang's benchmark client (`python -m sglang.bench_serving`) imports Hugging Face `datasets` at start, for every
# dataset; python-dateutil pinned below 3, as SGLang pins it (pandas, which `datasets` needs, would take the newest).
PEER_DEPS=("${MOONCAKE_SPEC:-mooncake-transfer-engine-non-cuda>=0.3.13.post1}" "datasets==5.2.0" "python-dateutil==2.9.0.post0")

pip_install() { "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$@"; }
# Of the requirements given, those not installed (one interpreter start for all: pip show costs seconds each).
missing_of() {
  "$VENV/bin/python" - "$@" <<'PYMISSING'
import re, sys
from importlib.metadata import PackageNotFoundError, version
for req in sys.argv[1:]:
    name = re.split(r"[<>=!~]", req, maxsplit=1)[0]
    exact = req.split("==", 1)[1] if "==" in req else None
    try:
        have = version(name)
    except PackageNotFoundError:
        print(req)
        continue
    if exact is not None and have != exact:
        print(req)
PYMISSING
}

[ -x "$VENV/bin/python" ] || { mkdir -p "$(dirname "$VENV")"; "$PY_BASE" -m venv "$VENV"; }

# Fast path: this very script completed here before and nothing it installs has gone since.
STAMP="$VENV/.kvstore-install-sglang-engine"
script_digest="$(sha256sum "$SCRIPT" | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" = "$script_digest" ] \
    && ls "$VENV"/torch-extensions/hicache_hash_cpp/hicache_hash_cpp*.so >/dev/null 2>&1 \
    && [ -z "$(missing_of "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" "sglang==$SGLANG_VERSION" \
                "xgrammar==0.2.7" "${RUNTIME_DEPS[@]}" "${KVSTORE_DEPS[@]}" "${PEER_DEPS[@]}")" ]; then
  echo "install-sglang-engine: sglang $SGLANG_VERSION already installed in $VENV"
  exit 0
fi
rm -f "$STAMP"

mapfile -t wanted < <(missing_of "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION")
if [ "${#wanted[@]}" -gt 0 ]; then
  echo "install-sglang-engine: torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
  pip_install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi
mapfile -t wanted < <(missing_of "sglang==$SGLANG_VERSION" "xgrammar==0.2.7")
if [ "${#wanted[@]}" -gt 0 ]; then
  echo "install-sglang-engine: sglang==$SGLANG_VERSION xgrammar==0.2.7 (without their dependencies)"
  pip_install --no-deps "sglang==$SGLANG_VERSION" "xgrammar==0.2.7"
fi
mapfile -t wanted < <(missing_of "${RUNTIME_DEPS[@]}" "${KVSTORE_DEPS[@]}" "${PEER_DEPS[@]}")
if [ "${#wanted[@]}" -gt 0 ]; then
  echo "install-sglang-engine: ${wanted[*]}"
  pip_install "${wanted[@]}"
fi

# SGLang compiles its HiCache page hash (a C++ extension) at the first storage lookup; built here once, into the
# virtualenv, so no engine start pays for it (the tests point TORCH_EXTENSIONS_DIR there). Needs g++ and ninja.
if ! ls "$VENV"/torch-extensions/hicache_hash_cpp/hicache_hash_cpp*.so >/dev/null 2>&1; then
  echo "install-sglang-engine: building SGLang's HiCache page hash extension"
  TORCH_EXTENSIONS_DIR="$VENV/torch-extensions" "$VENV/bin/python" -c \
    'from sglang.srt.mem_cache.cpp_utils.native_hash import _load_native_hash_module as load; load()'
fi

SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$PWD/harness/engines/sglang_cpu_shim:$PWD" "$VENV/bin/python" - <<'PYCHECK'
import torch, torchvision, transformers  # noqa: F401
import sglang
from sglang.srt.mem_cache.pool_host import mha
assert hasattr(mha, "transfer_kv_direct"), "the CPU shim (harness/engines/sglang_cpu_shim) is not active"
from kvstore.connectors import sglang as connector  # noqa: F401
from mooncake.store import MooncakeDistributedStore  # noqa: F401  (SGLang's mooncake backend; no CUDA)
import sglang.benchmark.serving  # noqa: F401  (python -m sglang.bench_serving)
print(f"install-sglang-engine: sglang {sglang.__version__}, torch {torch.__version__} import with the backend")
PYCHECK
echo "$script_digest" > "$STAMP"
