#!/usr/bin/env bash
# What the test command skips without: run every other .ci/install-*.sh (engine interfaces for the vLLM and
# SGLang connector tests, a real vLLM CPU engine, redis-server and Mooncake Store for the remote-tier tests,
# systemd-analyze for the unit-file test, and whatever installer is added next). Each script is idempotent and
# never touches torch.
#
# Needs: a Debian or Ubuntu machine (apt-get) and root, or sudo, for the system packages that are missing
# (redis-server, libibverbs1, systemd); the Python packages go into the python that runs the tests. Nothing is
# enabled at boot: the tests start their own servers. The real vLLM engine's virtualenv (a few GB) goes outside
# the checkout, in ${XDG_CACHE_HOME:-~/.cache}/kvstore-dev/venv-vllm, or where KVSTORE_VLLM_VENV says; the tests
# and benchmarks look for it there.
# Usage: bash .ci/install-extras.sh        (then the README's test command runs those tests too)
set -euo pipefail
cd "$(dirname "$0")/.."

for script in .ci/install-*.sh; do
    [ "$script" = ".ci/install-extras.sh" ] && continue
    echo "::: $script"
    bash "$script"
done
