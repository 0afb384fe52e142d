"""The disk tier through a real daemon: spill past DRAM, restart after SIGTERM and kill -9, damaged files, a
full filesystem, promotion of disk-only hits."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

import kvstore
from kvstore.tiers.disk.format import HEADER_BYTES, ChunkHeader, FormatError, pack_header, unpack_header
from kvstore.binding import rebind

from conftest import wait_for
from harness.daemons import short_tempdir
from support.disk import wait_written

MiB = 1 << 20


def disk_dir(d) -> str:
    return os.path.join(d.workdir, "disk")


def chunk_file(d, key: bytes, namespace: str) -> str:
    """The file of the chunk a client of ``namespace`` put under ``key`` (named by the key bound to it)."""
    name = rebind(namespace, key).hex()
    return os.path.join(disk_dir(d), name[:2], name + ".kv")


def put_chain(c: kvstore.Client, keys: list[bytes], payloads: list[bytes], batch: int = 4) -> None:
    for i in range(0, len(keys), batch):
        c.put(keys[i:i + batch], payloads[i:i + batch], parent=keys[i - 1] if i else None)


def read_all(c: kvstore.Client, keys: list[bytes], batch: int = 4) -> list[bytes]:
    """Read a chain back a few chunks at a time (each get promotes what it needs from disk)."""
    out = []
    for i in range(0, len(keys), batch):
        with c.get(keys[i:i + batch]) as views:
            out += [bytes(v) for v in views]
            if len(views) < len(keys[i:i + batch]):
                break
    return out


def test_more_than_dram_comes_back_exactly_some_from_disk(start_daemon):
    d = start_daemon("--host-mem", "16MiB")
    with d.client(namespace="spill", chunk_tokens=4) as c:
        keys = c.chunk_keys(list(range(4 * 40)))
        payloads = [os.urandom(MiB - 17 * i) for i in range(40)]
        put_chain(c, keys, payloads)
        result = c.lookup_tiers(keys, promote=False)
        assert result.count == 40 and result.tiers.get("disk", 0) > 0
        assert read_all(c, keys) == payloads
        counters = c.stats()["counters"]
        assert counters["promotions_disk_host"] > 0 and counters["demotions_host_disk"] > 0
        assert counters["checksum_failures"] == 0


def test_sigterm_restart_keeps_every_committed_chunk(start_daemon):
    d = start_daemon("--host-mem", "16MiB")
    with d.client(namespace="term", chunk_tokens=4) as c:
        keys = c.chunk_keys(list(range(4 * 24)))
        payloads = [os.urandom(MiB) for _ in keys]
        put_chain(c, keys, payloads)
    assert d.stop(signal.SIGTERM) == 0  # flushes the write-back queue first
    d.start()
    with d.client(namespace="term", chunk_tokens=4) as c:
        assert c.lookup_tiers(keys, promote=False).tiers == {"disk": 24}
        assert read_all(c, keys) == payloads
    assert "disk_index_rebuilt" in d.log() and "chunks=24" in d.log()


def test_sigterm_right_after_a_put_keeps_chunks_whose_sums_were_still_being_taken(start_daemon):
    # Write-back starts from a chunk's checksum: a stop that only flushed the write queue lost what was summed late.
    d = start_daemon("--host-mem", "256MiB", "--disk-size", "512MiB")
    with d.client(namespace="late-sums", chunk_tokens=4) as c:
        keys = c.chunk_keys(list(range(4 * 4)))
        payloads = [os.urandom(32 * MiB) for _ in keys]
        c.put(keys, payloads)
        assert d.stop(signal.SIGTERM) == 0
    d.start()
    with d.client(namespace="late-sums", chunk_tokens=4) as c:
        assert c.lookup_tiers(keys, promote=False).tiers == {"disk": 4}
        assert read_all(c, keys) == payloads


def test_kill9_serves_completed_writes_and_never_wrong_bytes(start_daemon):
    d = start_daemon("--host-mem", "32MiB")
    with d.client(namespace="kill", chunk_tokens=4) as c:
        safe = c.chunk_keys(list(range(4 * 8)))
        safe_payloads = [os.urandom(MiB) for _ in safe]
        put_chain(c, safe, safe_payloads)
        wait_written(c)
        racing = c.chunk_keys([7] + list(range(4 * 12 - 1)))
        racing_payloads = [os.urandom(MiB) for _ in racing]
        put_chain(c, racing, racing_payloads)
        d.proc.send_signal(signal.SIGKILL)  # writes of `racing` are in flight or queued
        d.proc.wait()
    d.start()
    with d.client(namespace="kill", chunk_tokens=4) as c:
        assert read_all(c, safe) == safe_payloads
        for key, payload in zip(racing, racing_payloads):  # each is there with its exact bytes, or a miss
            with c.get([key]) as views:
                assert not views or bytes(views[0]) == payload
        assert c.stats()["counters"]["checksum_failures"] == 0
    assert not [n for _, _, files in os.walk(disk_dir(d)) for n in files if ".tmp." in n]  # temporaries removed


def test_damaged_and_foreign_files_are_misses_or_ignored(start_daemon):
    d = start_daemon()
    with d.client(namespace="dmg", chunk_tokens=4) as c:
        chains = [c.chunk_keys([i] * 4) for i in range(5)]
        payloads = [os.urandom(256 << 10) for _ in chains]
        for keys, payload in zip(chains, payloads):
            c.put(keys, [payload])
    d.stop()
    flipped, truncated = chains[0][0], chains[1][0]
    with open(chunk_file(d, flipped, "dmg"), "r+b") as f:
        f.seek(HEADER_BYTES + 1000)
        byte = f.read(1)
        f.seek(HEADER_BYTES + 1000)
        f.write(bytes([byte[0] ^ 0x40]))
    with open(chunk_file(d, truncated, "dmg"), "r+b") as f:
        f.truncate(HEADER_BYTES + 100)
    os.makedirs(os.path.join(disk_dir(d), "ab"), exist_ok=True)
    with open(os.path.join(disk_dir(d), "ab", "notes.txt"), "w") as f:
        f.write("not a chunk")
    forged = os.path.join(disk_dir(d), "cd", "cd" + "0" * 30 + ".kv")
    os.makedirs(os.path.dirname(forged), exist_ok=True)
    with open(forged, "wb") as f:
        f.write(os.urandom(8192))
    d.start()
    with d.client(namespace="dmg", chunk_tokens=4) as c:
        for keys, payload in zip(chains[2:], payloads[2:]):
            with c.get(keys) as views:
                assert [bytes(v) for v in views] == [payload]
        with c.get(chains[0]) as views:
            assert len(views) == 0  # checksum failure on read: a miss
        assert c.lookup(chains[0]) == 0
        assert c.lookup(chains[1]) == 0  # wrong length: quarantined at start
        counters = c.stats()["counters"]
        assert counters["checksum_failures"] == 1 and counters["quarantined"] >= 3
    log = d.log()
    assert "disk_file_quarantined" in log and "disk_foreign_files_ignored" in log
    assert os.path.exists(os.path.join(disk_dir(d), "ab", "notes.txt"))  # not ours: left alone


@pytest.fixture
def small_fs():
    path = short_tempdir("smallfs-")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", path], capture_output=True)
    if done.returncode != 0:
        os.rmdir(path)
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.decode().strip()}")
    yield path
    subprocess.run(["umount", "-l", path], check=False)
    os.rmdir(path)


def test_full_filesystem_keeps_puts_in_dram(start_daemon, small_fs):
    d = start_daemon("--host-mem", "32MiB", "--disk-dir", small_fs, "--disk-size", "4MiB")
    with open(os.path.join(small_fs, "ballast"), "wb") as f:   # then the filesystem fills before the tier's cap
        f.write(b"\0" * (9 * MiB // 2))
    with d.client(namespace="full", chunk_tokens=4) as c:
        stored = []
        for i in range(12):
            keys = c.chunk_keys([i] * 4)
            payload = os.urandom(MiB)
            c.put(keys, [payload])   # never refused: a chunk the disk cannot take stays in DRAM
            stored.append((keys, payload))
            wait_written(c)
        for keys, payload in stored:
            with c.get(keys) as views:
                assert [bytes(v) for v in views] == [payload]
        counters = c.stats()["counters"]
        assert counters["disk_full_writes"] >= 1 and counters["io_errors"] == 0, counters
    assert "event=disk_full" in d.log()


def test_disk_only_hit_is_promoted_then_served_from_dram(start_daemon):
    d = start_daemon("--host-mem", "16MiB")
    with d.client(namespace="promo", chunk_tokens=4) as c:
        first = c.chunk_keys(list(range(16)))
        payloads = [os.urandom(MiB) for _ in first]
        c.put(first, payloads)
        wait_written(c)
        for i in range(30):  # push the first chain out of DRAM
            c.put(c.chunk_keys([100 + i] * 4), [os.urandom(MiB)])
        wait_written(c)
        assert c.lookup_tiers(first, promote=False).tiers == {"disk": 4}
        assert c.lookup(first) == 4  # starts the promotion
        assert wait_for(lambda: c.lookup_tiers(first, promote=False).tiers == {"host": 4}, 30), \
            "promotion did not finish"
        reads_before = c.stats()["counters"]["disk_reads"]
        with c.get(first) as views:
            assert [bytes(v) for v in views] == payloads
        assert c.stats()["counters"]["disk_reads"] == reads_before  # served from DRAM


def test_lz4_compression_round_trip(start_daemon):
    d = start_daemon("--host-mem", "16MiB", "--disk-compression", "lz4")
    with d.client(namespace="lz4", chunk_tokens=4) as c:
        keys = c.chunk_keys(list(range(4 * 6)))
        payloads = [bytes([i]) * (MiB // 2) + os.urandom(MiB // 2) for i in range(6)]
        c.put(keys, payloads)
        wait_written(c)
        assert c.stats()["counters"]["disk_write_bytes"] < sum(map(len, payloads)) * 0.6
    d.restart()
    with d.client(namespace="lz4", chunk_tokens=4) as c:
        assert read_all(c, keys) == payloads


def test_disk_size_zero_turns_the_tier_off(start_daemon):
    d = start_daemon("--disk-size", "0")
    with d.client(namespace="off") as c:
        assert "disk" not in c.stats()["tiers"]
    assert not os.path.exists(disk_dir(d))


def test_header_round_trip_and_rejections():
    header = ChunkHeader(b"k" * 16, "llama/bf16", 1000, 1000, 1234)
    block = pack_header(header)
    assert len(block) == HEADER_BYTES
    assert unpack_header(block, HEADER_BYTES + 1000) == header
    with pytest.raises(FormatError, match="file is"):
        unpack_header(block, HEADER_BYTES + 999)
    damaged = bytearray(block)
    damaged[70] ^= 1  # inside the namespace
    with pytest.raises(FormatError, match="checksum"):
        unpack_header(bytes(damaged))
    with pytest.raises(FormatError, match="magic"):
        unpack_header(b"\0" * HEADER_BYTES)
