#!/usr/bin/env bash
# Install the remote stores that the remote-tier tests and bench/peers.py run
# against: Debian's redis-server (and libibverbs1, which the Mooncake client
# library links against even over TCP), redis-py with hiredis, Mooncake
# Store's CUDA-free Python package, which ships mooncake_master and
# mooncake_client, and matplotlib for the benchmark's chart.
# Idempotent: does nothing that is already in place. Never touches torch.
#
# Needs apt-get and root (or sudo) only for the system packages that are missing. A redis-server it installs is
# not left enabled at boot nor running: Debian's package enables and starts its service, which this script undoes
# (the tests start their own servers on ports of their own). A redis-server that was there before is left as
# its administrator set it.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
MOONCAKE_SPEC="${MOONCAKE_SPEC:-mooncake-transfer-engine-non-cuda>=0.3.13.post1}"

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1' || need_apt+=(libibverbs1)
if ((${#need_apt[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "install-peers: installing ${need_apt[*]} needs root or sudo; install them yourself and rerun" >&2
            exit 1
        fi
        SUDO="sudo"
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-peers: no apt-get to install ${need_apt[*]}; install them yourself and rerun" >&2
        exit 1
    fi
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
    # The package just installed enabled its service at boot and started it: the tests need neither.
    if [[ " ${need_apt[*]} " == *" redis-server "* ]] && command -v systemctl >/dev/null 2>&1; then
        $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
    fi
fi

pip_install() {
    "$PYTHON" -m pip install --quiet --disable-pip-version-check "$@"
}

"$PYTHON" -c 'import redis' 2>/dev/null || pip_install 'redis>=5.0'
# hiredis: redis-py's C reply parser (large GETs several times faster than the pure-Python one).
"$PYTHON" -c 'import hiredis' 2>/dev/null || pip_install 'hiredis>=2'
# bench/peers.py draws its chart with matplotlib.
"$PYTHON" -c 'import matplotlib' 2>/dev/null || pip_install matplotlib

if ! "$PYTHON" - "$MOONCAKE_SPEC" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
from packaging.requirements import Requirement
req = Requirement(sys.argv[1])
sys.exit(0 if req.specifier.contains(version(req.name), prereleases=True) else 1)
PY
then
    # Its dependencies are small (aiohttp, requests, msgpack) and include no torch.
    pip_install "$MOONCAKE_SPEC"
fi

"$PYTHON" - <<'PY'
import importlib.util, os, shutil
spec = importlib.util.find_spec("mooncake")
folder = spec.submodule_search_locations[0]
for name in ("mooncake_master", "mooncake_client"):
    path = os.path.join(folder, name)
    assert os.access(path, os.X_OK), f"{path} missing"
from mooncake.store import MooncakeDistributedStore  # noqa: F401  (imports without CUDA)
import redis  # noqa: F401
assert shutil.which("redis-server"), "redis-server missing"
print("install-peers: redis-server, redis-py and mooncake store ready")
PY
