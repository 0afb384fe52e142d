#!/usr/bin/env bash
# What the test command skips without: run every other .ci/install-*.sh (engine interfaces for the vLLM and
# SGLang connector tests, redis-server and Mooncake Store for the remote-tier tests, systemd-analyze for the
# unit-file test, and whatever installer is added next). Each script is idempotent and never touches torch.
# Usage: bash .ci/install-extras.sh        (then the README's test command runs those tests too)
set -euo pipefail
cd "$(dirname "$0")/.."

for script in .ci/install-*.sh; do
    [ "$script" = ".ci/install-extras.sh" ] && continue
    echo "::: $script"
    bash "$script"
done
