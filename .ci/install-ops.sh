#!/usr/bin/env bash
# systemd-analyze, for tests/server/test_ops.py's check of systemd/kvstore.service. Idempotent; skipped where present.
set -euo pipefail
if command -v systemd-analyze >/dev/null 2>&1; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends systemd >/dev/null
else
    echo "install-ops: no apt-get; the systemd unit test will be skipped" >&2
fi
