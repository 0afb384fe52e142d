"""A daemon whose ``/dev/shm`` cannot hold its arena: run inside a private mount namespace (issue 24, item 11).

``unshare -m --propagation private python tests/support/small_shm.py SIZE`` mounts a tmpfs of SIZE on ``/dev/shm`` — in
that namespace only: the machine's own ``/dev/shm`` is not touched — starts a daemon whose host tier is larger
than it, puts 1 MiB chunks, each kept leased (so none can be evicted to make room), until one is refused, checks
that the daemon still serves what it stored, and prints one JSON line: how many chunks went in, the refusal, and
whether the daemon was still up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

# the repository root, where harness/ is
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CHUNK = 1 << 20


def main(size: str) -> dict:
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", "/dev/shm"], check=True)
    import kvstore
    from harness.daemons import Daemons

    out: dict = {"stored": 0, "refusal": None}
    with Daemons() as ds:
        d = ds.start("--host-mem", "64MiB", "--disk-size", "0")
        with d.client() as c:
            keys, leases = [os.urandom(16) for _ in range(64)], []
            for i, key in enumerate(keys):
                try:
                    c.put([key], [bytes([i]) * CHUNK])
                except kvstore.StoreFullError as exc:
                    out["refusal"] = str(exc)
                    break
                leases.append(c.get([key]))
                out["stored"] += 1
            out["served"] = sum(bytes(lease.views[0][:1]) == bytes([i]) for i, lease in enumerate(leases))
            out["alive"] = d.proc.poll() is None
            out["backing_refused"] = c.stats()["tiers"]["host"]["backing_refused"]
    out["exit"] = d.proc.returncode
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
