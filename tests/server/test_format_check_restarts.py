"""The format check outlives restarts: a client that cuts a namespace's chunks at another size is refused after a
warm restart (SIGTERM: the kept arena's description), a crash (SIGKILL: the journal) and a cold restart that
rebuilds the index from disk, as before it (``kvstore/server/requests/compat.py``)."""

from __future__ import annotations

import signal

import pytest

import kvstore
from conftest import wait_for

pytestmark = pytest.mark.integration

RESTARTS = {
    "sigterm": ("--adopt", "--disk-size", "0", "--host-mem", "64MiB"),
    "sigkill": ("--adopt", "--disk-size", "0", "--host-mem", "64MiB"),
    "cold": ("--no-adopt", "--host-mem", "64MiB"),
}


def refused(daemon) -> bool:
    try:
        with daemon.client(namespace="persist", chunk_tokens=32):
            return False
    except kvstore.IncompatibleError:
        return True


@pytest.mark.parametrize("how", sorted(RESTARTS))
def test_a_client_of_another_chunk_size_is_refused_after_a_restart_as_before(start_daemon, how):
    d = start_daemon(*RESTARTS[how])
    with d.client(namespace="persist", chunk_tokens=16) as c:
        keys = c.chunk_keys(list(range(16 * 4)))
        assert c.put(keys, [b"x" * 4096] * len(keys)) == len(keys)
        assert wait_for(lambda: (c.stats()["tiers"]["disk"]["chunks"] >= len(keys)) if how == "cold"
                        else c.stats()["integrity"]["sums_pending"] == 0, timeout=30)
    assert refused(d)
    d.stop(signal.SIGKILL if how == "sigkill" else signal.SIGTERM)
    d.start()
    assert refused(d)   # at once: chunks still being verified count as held
    with d.client(namespace="other", chunk_tokens=16) as probe:
        assert wait_for(lambda: probe.stats()["adoption"]["state"] != "verifying", timeout=30)
    assert refused(d)
    with d.client(namespace="persist", chunk_tokens=16) as c:
        assert c.lookup(keys) == len(keys)


def test_once_a_namespace_holds_nothing_a_new_chunk_size_is_accepted_after_a_restart(start_daemon):
    d = start_daemon(*RESTARTS["sigterm"])
    with d.client(namespace="persist", chunk_tokens=16) as c:
        keys = c.chunk_keys(list(range(16 * 4)))
        assert c.put(keys, [b"x" * 4096] * len(keys)) == len(keys)
        assert c.clear() == len(keys)
    d.stop()
    d.start()
    with d.client(namespace="persist", chunk_tokens=32) as c:
        assert c.lookup(c.chunk_keys(list(range(64)))) == 0
