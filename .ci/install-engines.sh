#!/usr/bin/env bash
# Install the vLLM and SGLang wheels for the connector tests, without their
# pinned CUDA dependencies.
#
# Both engines pin a CUDA build of torch; the tests only need the engines'
# interface modules (vLLM's KVConnectorBase_V1 and scheduler records, SGLang's
# HiCacheStorage), so each wheel goes in with --no-deps, followed by the
# pure-Python packages (and triton, which SGLang's package __init__ imports)
# that those modules import at load time. torch itself is never touched: the
# script records its version first and fails if anything changed it.
#
# Idempotent: a package already at the wanted version is skipped.
# Usage: bash .ci/install-engines.sh [python]   (default: python)
set -euo pipefail

PY="${1:-${PYTHON:-python}}"
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"

# What `from vllm.distributed.kv_transfer.kv_connector.v1.base import
# KVConnectorBase_V1`, `vllm.config`, `vllm.v1.core.sched.output` and
# `sglang.srt.mem_cache.hicache_storage` import beyond what kvstore and its
# test extra already bring.
IMPORT_DEPS=(
  psutil cbor2 openai openai-harmony pillow pybase64 cachetools msgspec
  xgrammar apache-tvm-ffi fastapi starlette opentelemetry-api
  partial-json-parser llguidance triton
  urllib3 aiohttp requests cloudpickle py-cpuinfo orjson ipython
)

# The installed version of a distribution, or nothing (importlib: pip show costs seconds a package).
installed_version() {
  "$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1" 2>/dev/null || true
}

torch_before="$(installed_version torch)"

# The engines themselves without their dependencies (they pin CUDA builds); the pure-Python modules their
# interfaces import with theirs (torch is already installed, so a torch requirement is satisfied as it is).
engines=()
[ "$(installed_version vllm)" = "$VLLM_VERSION" ] || engines+=("vllm==$VLLM_VERSION")
[ "$(installed_version sglang)" = "$SGLANG_VERSION" ] || engines+=("sglang==$SGLANG_VERSION")
deps=()
for pkg in "${IMPORT_DEPS[@]}"; do
  [ -n "$(installed_version "$pkg")" ] || deps+=("$pkg")
done

if [ "${#deps[@]}" -gt 0 ]; then
  echo "install-engines: installing ${deps[*]}"
  "$PY" -m pip install --disable-pip-version-check -q "${deps[@]}"
fi
if [ "${#engines[@]}" -gt 0 ]; then
  echo "install-engines: installing ${engines[*]} (without their dependencies)"
  "$PY" -m pip install --no-deps --disable-pip-version-check -q "${engines[@]}"
else
  echo "install-engines: vllm $VLLM_VERSION and sglang $SGLANG_VERSION already installed"
fi

torch_after="$(installed_version torch)"
if [ "$torch_before" != "$torch_after" ]; then
  echo "install-engines: torch changed from $torch_before to $torch_after" >&2
  exit 1
fi

# The interface modules must import on a machine without a GPU.
VLLM_TARGET_DEVICE="${VLLM_TARGET_DEVICE:-cpu}" "$PY" - <<'PYCHECK'
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: F401
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: F401
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage  # noqa: F401
import vllm.config  # noqa: F401
print("install-engines: engine interfaces import")
PYCHECK
