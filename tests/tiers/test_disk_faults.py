"""Disk faults under a running daemon: directory removed, file truncated, directory read-only, disk full.

Each must give clear errors counted in the daemon's counters, no crash, and chunks still served exactly (a chunk
the disk lost is a miss, never wrong bytes). Skipped while the daemon has no disk tier (no ``--disk-dir``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import pytest

from conftest import wait_for as _wait_for

import kvstore

from harness.workload import payload_for

CHUNK = 256 << 10
ERROR_COUNTERS = ("io_errors", "checksum_failures", "quarantined", "disk_write_skipped")


def _has_disk_tier() -> bool:
    from kvstore.config import SETTINGS
    return any(s.name == "disk_dir" for s in SETTINGS)


pytestmark = pytest.mark.skipif(not _has_disk_tier(), reason="the daemon has no disk tier (--disk-dir) yet")


def disk_errors(c: kvstore.Client) -> int:
    counters = c.stats()["counters"]
    return sum(int(counters.get(name, 0)) for name in ERROR_COUNTERS)


def wait_for(predicate, timeout: float = 15.0) -> bool:
    return _wait_for(predicate, timeout)


def put_chain(c: kvstore.Client, seed: int, chunks: int) -> list[bytes]:
    """Put one chunk at a time (a full host tier makes room by demoting); a full disk may refuse some."""
    keys = c.chunk_keys([seed * 1_000_003 + i for i in range(256 * chunks)])
    for key in keys:
        try:
            c.put([key], [payload_for(key, CHUNK)])
        except kvstore.StoreFullError as exc:
            assert "full" in str(exc)  # a clear error naming what is full
    return keys


def read_each(c: kvstore.Client, keys: list[bytes]) -> tuple[int, int, int]:
    """(correct, corrupt, missing), key by key."""
    correct = corrupt = missing = 0
    for key in keys:
        with c.get([key]) as views:
            if not views:
                missing += 1
            elif bytes(views[0]) == payload_for(key, CHUNK):
                correct += 1
            else:
                corrupt += 1
    return correct, corrupt, missing


@pytest.fixture
def disk_daemon(start_daemon, tmp_path):
    def start(disk_dir: str | None = None, disk_size: str = "64MiB"):
        disk_dir = disk_dir or str(tmp_path / "disk")
        d = start_daemon("--host-mem", "4MiB", "--disk-dir", disk_dir, "--disk-size", disk_size)
        return d, disk_dir
    return start


def on_disk(c: kvstore.Client) -> int:
    return int(c.stats()["tiers"].get("disk", {}).get("chunks", 0))


def test_disk_dir_removed_while_running(disk_daemon):
    d, disk_dir = disk_daemon()
    with d.client(namespace="t") as c:
        keys = put_chain(c, 1, 24)  # 6 MiB through a 4 MiB host tier: demotions to disk
        assert wait_for(lambda: on_disk(c) > 0)
        while os.path.exists(disk_dir):   # the daemon may still be writing a file into it: remove until gone
            shutil.rmtree(disk_dir, ignore_errors=True)
        more = put_chain(c, 2, 24)  # write-backs into a directory that is gone
        correct, corrupt, _missing = read_each(c, keys + more)
        assert corrupt == 0 and correct > 0
        assert wait_for(lambda: disk_errors(c) > 0), c.stats()["counters"]
        c.ping()


def test_truncated_files_are_misses_not_wrong_bytes(disk_daemon):
    d, disk_dir = disk_daemon()
    with d.client(namespace="t") as c:
        keys = put_chain(c, 3, 24)
        assert wait_for(lambda: on_disk(c) > 0)
        files = glob.glob(os.path.join(disk_dir, "**", "*.kv"), recursive=True)
        assert files
        for path in files:
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
        put_chain(c, 4, 24)  # push the originals out of DRAM so reads must come from disk
        _correct, corrupt, missing = read_each(c, keys)
        assert corrupt == 0
        if missing:
            assert disk_errors(c) > 0, c.stats()["counters"]
        c.ping()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits; a read-only directory needs a user")
def test_disk_dir_made_read_only(disk_daemon):
    d, disk_dir = disk_daemon()
    with d.client(namespace="t") as c:
        keys = put_chain(c, 5, 24)
        assert wait_for(lambda: on_disk(c) > 0)
        for root, dirs, _ in os.walk(disk_dir):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o500)
        os.chmod(disk_dir, 0o500)
        try:
            more = put_chain(c, 6, 24)
            correct, corrupt, _ = read_each(c, keys + more)
            assert corrupt == 0 and correct > 0
            assert wait_for(lambda: disk_errors(c) > 0), c.stats()["counters"]
        finally:
            for root, _dirs, _ in os.walk(disk_dir):
                os.chmod(root, 0o700)


def test_disk_full(disk_daemon, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)],
                             capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot mount a small tmpfs here to fill up")
    try:
        d, _ = disk_daemon(str(small / "disk"), disk_size="768KiB")
        with open(small / "ballast", "wb") as f:  # then the device fills before the tier's cap
            f.write(b"\0" * (3 << 19))
        with d.client(namespace="t") as c:
            keys = put_chain(c, 7, 32)  # 8 MiB into a 2 MiB device
            correct, corrupt, _ = read_each(c, keys)
            assert corrupt == 0 and correct > 0
            assert wait_for(lambda: disk_errors(c) > 0), c.stats()["counters"]
            c.ping()
            d.stop()
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


# -- sizes measured against what the filesystem can give the tier -----------------------------------------------

@pytest.fixture
def mount_tmpfs(tmp_path):
    """``mount_tmpfs("20m")``: a real small filesystem in a scratch directory, unmounted afterwards."""
    mounted: list[str] = []

    def mount(size: str) -> str:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip() or 'mount refused'}")
        mounted.append(str(where))
        return str(where)
    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", where], capture_output=True)


def test_a_disk_size_the_filesystem_cannot_hold_is_refused_at_start(start_daemon, mount_tmpfs):
    fs = mount_tmpfs("20m")
    d = start_daemon("--disk-dir", os.path.join(fs, "disk"), "--disk-size", "20MiB", wait=False)
    assert d.proc.wait(60) == 2
    errors = [line for line in d.log().splitlines() if line.startswith("kvstore: error:")]
    assert len(errors) == 1, d.log()
    assert "--disk-size: 20.0 MiB does not fit the filesystem of" in errors[0] and "give at most 18MiB" in errors[0]
    assert "kept for directories and file overheads" in errors[0]


def test_a_disk_size_that_fits_is_served_up_to_its_cap(start_daemon, mount_tmpfs):
    """The size the refusal offers is one the filesystem really holds: the tier fills to its cap, no ENOSPC."""
    fs = mount_tmpfs("20m")
    d = start_daemon("--host-mem", "8MiB", "--disk-dir", os.path.join(fs, "disk"), "--disk-size", "18MiB")
    with d.client(namespace="t") as c:
        keys = put_chain(c, 3, 100)   # 25 MiB through an 8 MiB host tier into an 18 MiB disk tier
        assert wait_for(lambda: c.stats()["disk"]["write_queue_chunks"] == 0)
        counters = c.stats()["counters"]
        assert counters["disk_full_writes"] == 0 and counters["io_errors"] == 0, counters
        assert on_disk(c) >= 18 * (1 << 20) // (CHUNK + 4096) - 1
        _, corrupt, _ = read_each(c, keys)
        assert corrupt == 0
    assert "event=disk_sized" in d.log()


def test_auto_size_counts_the_tiers_own_files_so_a_restart_keeps_them(start_daemon, mount_tmpfs):
    fs = mount_tmpfs("128m")
    d = start_daemon("--host-mem", "32MiB", "--disk-dir", os.path.join(fs, "disk"), "--disk-size", "auto")
    with d.client(namespace="t", chunk_tokens=4) as c:
        cap = c.stats()["tiers"]["disk"]["capacity_bytes"]
        chunks = cap // ((1 << 20) + 8192)   # nearly fill the tier: the free space drops by as much
        for i in range(chunks):
            c.put(c.chunk_keys([i] * 4), [payload_for(bytes([i]) * 16, 1 << 20)])
        assert wait_for(lambda: on_disk(c) == chunks, timeout=60)
    sized = [line for line in d.log().splitlines() if "event=disk_sized" in line]
    assert "requested=auto" in sized[0] and "usable_bytes=" in sized[0] and "held_bytes=0" in sized[0], sized
    d.restart()
    with d.client(namespace="t", chunk_tokens=4) as c:
        stats = c.stats()
        assert stats["tiers"]["disk"]["capacity_bytes"] == cap   # its own files count as room it has
        assert on_disk(c) == chunks   # nothing dropped for a smaller cap
