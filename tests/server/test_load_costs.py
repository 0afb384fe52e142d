"""Load costs per medium for routers: the connectors time their own loads (DRAM and GPU-tier hits never pass
through the daemon) and tell the daemon, which publishes nanoseconds per KiB per medium in ``stats``
(``load_ns_per_kib``) beside the disk tier's own reads. Real daemons, the real connector store."""

from __future__ import annotations

import time

import pytest
import torch

from conftest import wait_for

import kvstore
from kvstore.connectors.common.layout import KVGeometry
from kvstore.connectors.common.store import ChunkStore
from kvstore.errors import BadRequestError, UsageError
from kvstore.protocol.wire import Op


def costs(d) -> dict:
    with d.client(namespace="watch") as c:
        return c.stats()["load_ns_per_kib"]


def test_a_client_s_load_notes_become_the_daemon_s_cost_per_kib(start_daemon):
    d = start_daemon()
    assert "CPU" not in costs(d) and "GPU" not in costs(d)   # nobody has loaded yet: left to the router
    with d.client(namespace="t") as c:
        c.note_load("CPU", 1 << 20, 0.002)   # the first note goes at once
        c.note_load("CPU", 1 << 20, 0.002)   # within a second of it: summed, told with the next note
        assert wait_for(lambda: costs(d).get("CPU") == int(2e6 / 1024))
        time.sleep(1.0)   # a second after the first note: the next one is due at once
        c.note_load("GPU", 1 << 20, 0.0005)
        assert wait_for(lambda: costs(d).get("GPU") == int(5e5 / 1024))
        # the CPU sum held back above went with that note: 6 ms for 3 MiB
        assert wait_for(lambda: costs(d).get("CPU") == int(6e6 / 3072))


def test_the_connector_times_its_leases_per_medium(start_daemon):
    d = start_daemon()
    geometry = KVGeometry(2, 2, 4, torch.float32, 16)
    with d.client(namespace="conn") as c:
        store = ChunkStore(c, "conn", geometry)
        keys = store.keys(torch.arange(32))
        chunks = torch.randn(len(keys), *geometry.chunk_shape)
        assert store.store(keys, chunks, 0) == len(keys)
        with store.lease(keys) as views:
            assert len(views) == 2   # the copy into the engine happens here, and is timed
        assert wait_for(lambda: costs(d).get("CPU", 0) > 0)


@pytest.mark.parametrize("note, error", [
    ({"media": ["DISK"], "bytes": [1], "ns": [1]}, r"media\[0\] = .DISK. is not a medium"),
    ({"media": ["CPU"], "bytes": [-1], "ns": [1]}, r"bytes\[0\] must be an integer"),
    ({"media": ["CPU"], "bytes": [1]}, "fields 'media', 'bytes' and 'ns' must be lists"),
    ({"media": ["CPU", "GPU", "CPU"], "bytes": [1, 1, 1], "ns": [1, 1, 1]}, "at most 2"),
])
def test_a_bad_load_note_is_refused_in_one_line(client, note, error):
    with pytest.raises(BadRequestError, match=error) as refused:
        client.request({"op": Op.LOAD_TIMES, **note})
    assert "\n" not in str(refused.value)


def test_note_load_checks_its_arguments(client):
    with pytest.raises(UsageError, match="medium 'STORAGE'"):
        client.note_load("STORAGE", 1, 0.1)
    with pytest.raises(UsageError, match="nbytes must be"):
        client.note_load("CPU", -1, 0.1)
    assert isinstance(client, kvstore.Client)


def test_every_medium_s_cost_is_on_metrics():
    from kvstore.metrics.collector import unmapped_paths
    assert unmapped_paths({"load_ns_per_kib": {"CPU": 900, "GPU": 40, "STORAGE": 3000}}) == []
