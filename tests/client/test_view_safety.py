"""No reader can change the bytes another reader gets: every view a client hands out is read-only, over ipc://
(leased, or served from the shared index) and over tcp://, and a tensor made from one cannot write into the
arena (it faults: the view lies on a read-only mapping), while other clients keep getting the stored bytes —
from DRAM and once the chunk is on disk too."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kvstore
from support.disk import wait_written
from harness.workload import free_port

STORED = b"a" * 1000
FLOATS = np.ones(1024, dtype=np.float32).tobytes()


def _stored_everywhere(c: kvstore.Client, keys: list[bytes], payload: bytes) -> None:
    """A second client's get, get_into and verified get all return ``payload``."""
    with c.get(keys) as views:
        assert [bytes(v) for v in views] == [payload]
    dest = bytearray(len(payload))
    assert c.get_into(keys, [dest]) == 1 and bytes(dest) == payload
    with c.get(keys, verify=True) as views:
        assert [bytes(v) for v in views] == [payload]


def _write_attempts(view: memoryview) -> None:
    """Every Python-level way to write through a view fails."""
    assert view.readonly
    with pytest.raises(TypeError):
        view[0:3] = b"XYZ"
    array = np.frombuffer(view, dtype=np.uint8)
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array.setflags(write=True)
    with pytest.raises(ValueError):
        array[0] = 1


@pytest.mark.parametrize("on_disk", [False, True], ids=["in-dram", "written-to-disk"])
def test_a_write_through_a_view_fails_and_other_readers_get_the_stored_bytes(daemon, on_disk):
    with daemon.client(namespace="x", chunk_tokens=16) as writer, daemon.client(namespace="x", chunk_tokens=16) as c:
        keys = writer.chunk_keys(list(range(16)))
        assert writer.put(keys, [STORED]) == 1
        if on_disk:
            wait_written(writer)
            assert writer.stats()["counters"]["disk_writes"] >= 1
        with c.get(keys) as views:
            assert len(views) == 1
            _write_attempts(views[0])
        seen: list[bool] = []
        assert c.read(keys, lambda views: seen.extend(v.readonly for v in views)) == 1   # index-served views
        assert seen and all(seen)
        with daemon.client(namespace="x", chunk_tokens=16) as fresh:
            _stored_everywhere(fresh, keys, STORED)


def test_views_over_tcp_are_read_only(start_daemon):
    port = free_port()
    d = start_daemon("--tcp", f"127.0.0.1:{port}")
    with kvstore.connect(f"tcp://127.0.0.1:{port}", namespace="x", chunk_tokens=16, timeout=10.0) as c:
        keys = c.chunk_keys(list(range(16)))
        c.put(keys, [STORED])
        with c.get(keys) as views:
            _write_attempts(views[0])
        seen: list[bool] = []
        c.read(keys, lambda views: seen.extend(v.readonly for v in views))
        assert seen == [True]
        _stored_everywhere(c, keys, STORED)
    with d.client(namespace="x", chunk_tokens=16) as local:
        _stored_everywhere(local, keys, STORED)


INPLACE = textwrap.dedent("""
    import sys, warnings
    import torch
    import kvstore
    c = kvstore.connect(sys.argv[1], namespace="x", chunk_tokens=16)
    keys = c.chunk_keys(list(range(16)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # torch says it does not honour read-only buffers
        with c.get(keys) as views:
            t = torch.frombuffer(views[0], dtype=torch.float32)
            print("reading", float(t[0]), flush=True)   # reading through the tensor is fine
            t.mul_(2)                                   # writing is not: the mapping is read-only
    print("wrote", flush=True)
""")


@pytest.mark.parametrize("on_disk", [False, True], ids=["in-dram", "written-to-disk"])
def test_an_in_place_tensor_op_on_a_view_cannot_reach_the_arena(daemon, on_disk):
    pytest.importorskip("torch")
    with daemon.client(namespace="x", chunk_tokens=16) as writer:
        keys = writer.chunk_keys(list(range(16)))
        writer.put(keys, [FLOATS])
        if on_disk:
            wait_written(writer)
        out = subprocess.run([sys.executable, "-c", INPLACE, daemon.address], capture_output=True, text=True,
                             timeout=120)
        assert "reading 1.0" in out.stdout, out.stderr
        assert "wrote" not in out.stdout and out.returncode == -signal.SIGSEGV, (out.returncode, out.stderr)
        with daemon.client(namespace="x", chunk_tokens=16) as fresh:
            _stored_everywhere(fresh, keys, FLOATS)
            dest = np.zeros(1024, dtype=np.float32)
            assert fresh.get_into(keys, [dest]) == 1 and float(dest.max()) == 1.0


def test_reserved_slots_stay_writable_for_their_writer(client):
    """What a reservation lends is the writer's own slot (the read-write mapping), filled before commit."""
    keys = client.chunk_keys(list(range(512)))
    reservation = client.reserve(keys, [1000, 1000])
    for i, view in enumerate(reservation.views):
        assert view is not None and not view.readonly
        view[:] = bytes([i + 1]) * 1000
    assert reservation.commit() == 2
    with client.get(keys) as views:
        assert [bytes(v) for v in views] == [b"\x01" * 1000, b"\x02" * 1000]
        assert all(v.readonly for v in views)
