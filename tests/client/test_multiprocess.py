"""Several client processes share one daemon's chunks; a client survives a daemon restart."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import kvstore
from conftest import wait_for

WRITER = textwrap.dedent("""
    import sys, kvstore
    c = kvstore.connect(sys.argv[1], namespace="shared")
    keys = c.chunk_keys(list(range(256 * 8)))
    c.put(keys, [bytes([i]) * (300_000 + i) for i in range(8)])
    print(c.lookup(keys))
""")

READER = textwrap.dedent("""
    import sys, kvstore
    c = kvstore.connect(sys.argv[1], namespace="shared")
    keys = c.chunk_keys(list(range(256 * 8)))
    with c.get(keys) as views:
        ok = [bytes(v) == bytes([i]) * (300_000 + i) for i, v in enumerate(views)]
    print(len(ok), all(ok))
""")


def run(code: str, address: str) -> str:
    return subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()


def test_two_processes_share_chunks(daemon):
    assert run(WRITER, daemon.address) == "8"
    assert run(READER, daemon.address) == "8 True"
    tcp_free = kvstore.connect(daemon.address, namespace="shared", use_arena=False)
    with tcp_free.get(tcp_free.chunk_keys(list(range(256 * 8)))) as views:
        assert bytes(views[7]) == bytes([7]) * 300_007
    tcp_free.close()


def test_client_reconnects_after_daemon_restart(daemon):
    c = daemon.client(namespace="t")
    keys = c.chunk_keys(list(range(512)))
    c.put(keys, [b"a" * 5000, b"b" * 5000])
    daemon.restart()
    # The chunks survive on the disk tier; the client says hello again by itself.
    assert c.lookup(keys) == 2
    assert c.put(keys, [b"c" * 5000, b"d" * 5000]) == 0  # already stored: skipped
    # A get waits up to 2 s for disk reads and may hand out a shorter prefix when one takes longer (on a loaded
    # 2-core host it has): a short prefix is a miss, never other bytes. Ask again until both came back.
    def read_back() -> list[bytes]:
        with c.get(keys) as views:
            got = [bytes(v) for v in views]
        assert got == [b"a" * 5000, b"b" * 5000][:len(got)]
        return got

    assert wait_for(lambda: len(read_back()) == 2, 20)
    assert read_back() == [b"a" * 5000, b"b" * 5000]
    c.close()
