"""The host arena takes memory as chunks arrive, never all of it at start, and never a SIGBUS (issue 24, item 11).

Pages of the arena file are reserved when the allocator first hands out an extent reaching into them
(``tiers/arena.py``): right after start a large arena holds almost nothing (its ``st_blocks``), and it grows with
the chunks put. Where ``/dev/shm`` cannot back the arena, a put is refused with StoreFullError and the daemon
keeps serving: shown on a real tmpfs smaller than the arena, mounted on ``/dev/shm`` in a private mount namespace
(``small_shm.py``; the machine's own ``/dev/shm`` is not touched), which needs root and ``unshare``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from kvstore.mapped.arena import GRANULE, arena_path_for
from harness.daemons import sandbox_env, short_tempdir
from harness.memory import large_host_mem
from support.paths import SUPPORT

MiB = 1 << 20


def _arena_bytes(d) -> int:
    """Memory the daemon's arena file holds (its blocks), not its size."""
    return os.stat(arena_path_for(d.socket_path)).st_blocks * 512


def test_a_large_arena_holds_little_at_start_and_grows_with_the_chunks(start_daemon):
    size = large_host_mem()
    d = start_daemon("--host-mem", size, "--disk-size", "0")
    assert os.stat(arena_path_for(d.socket_path)).st_size >= 1 << 30
    at_start = _arena_bytes(d)
    assert at_start <= GRANULE
    ready = next(line for line in d.log().splitlines() if "event=ready" in line)
    assert "host_mem_max=" in ready and "host_mem_now=0B" in ready, ready
    with d.client() as c:
        keys = [os.urandom(16) for _ in range(32)]
        assert c.put(keys, [b"g" * MiB] * 32) == 32
        reserved = c.stats()["tiers"]["host"]["reserved_bytes"]
    grown = _arena_bytes(d)
    assert grown >= 32 * MiB and reserved >= 32 * MiB
    assert grown < 1 << 30   # what the chunks (and the credit lent for them) needed, not the arena


def _can_mount_a_private_tmpfs() -> str:
    """Why a tmpfs cannot be mounted on /dev/shm in a private namespace here ("" when it can)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs", "-o", "size=1m",
                            "tmpfs", "/dev/shm"], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"cannot mount a tmpfs in a private namespace: {probe.stderr.strip()}"


def test_a_dev_shm_too_small_for_the_arena_is_a_full_tier_not_a_crash():
    why = _can_mount_a_private_tmpfs()
    if why:
        pytest.skip(why)
    workdir = short_tempdir()
    try:
        helper = os.path.join(SUPPORT, "small_shm.py")
        result = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, helper, "16m"],
                                capture_output=True, text=True, timeout=120, env=sandbox_env(workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0 < out["stored"] < 16 and out["served"] == out["stored"], out   # a 64 MiB tier in 16 MiB of tmpfs
    assert "/dev/shm has no room to back more of the arena" in out["refusal"], out
    assert out["alive"] and out["exit"] == 0 and out["backing_refused"] >= 1, out
