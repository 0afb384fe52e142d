"""The daemon's safeguards against serving wrong KV: checksums, scrubs, engines' verification, key parameters.

One object the daemon creates with its store and starts with its loop, so that ``daemon.py`` only wires it in:

* ``integrity`` takes every committed chunk's checksum off the event loop and re-checks host slots
  (``store/integrity.py``; the Store's damage path is ``store/damage.py``);
* ``scrubber`` checks every copy of every chunk on demand (``kvstore scrub``) and, with ``--scrub-rate``, in the
  background at that many bytes per second (``store/scrub.py``);
* ``verify`` counts what engines report when they compute a prefix they could have loaded and compare
  (``VERIFY``): checks, mismatches, the largest difference; a mismatch drops the chain;
* ``params`` refuses a client whose chunk size, key scheme or hash seed differ from those of the chunks held
  for its namespace (``server/requests/compat.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ... import logs
from ...store.integrity import Integrity
from ...store.scrub import Scrubber
from .scrub_passes import ScrubPasses
from .compat import NamespaceParams

if TYPE_CHECKING:
    from ...tiers.gpu.mover import GpuMover
    from ...tiers.disk.mover import DiskMover
    from ...tiers.remote.mover import RemoteMover
    from ...store.store import Store


@dataclass
class VerifyCounters:
    reports: int = 0
    checks: int = 0
    mismatches: int = 0
    max_difference: float = 0.0   # largest difference any report gave (inf: non-finite values were seen)
    dropped: int = 0              # chunks dropped because a verification found them wrong


class Safeguards:
    def __init__(self, store: "Store", disk_mover: "DiskMover | None", scrub_rate: int) -> None:
        self.store = store
        self.integrity = Integrity(store)
        self.scrubber = Scrubber(store, self.integrity, disk_mover)
        self.passes = ScrubPasses(self.scrubber)   # the passes clients start (kvstore scrub)
        self.verify = VerifyCounters()
        self.params = NamespaceParams(self._holds_chunks, store.key_params)
        self.kept_waiting: Callable[[str], bool] | None = None   # chunks of a namespace still being adopted
        self.scrub_rate = scrub_rate
        self.remote: "RemoteMover | None" = None
        self.reported = 0   # chunks clients reported as failing their checksum in a view

    def start(self, loop: asyncio.AbstractEventLoop, remote: "RemoteMover | None",
              gpu_mover: "GpuMover | None") -> list[asyncio.Task]:
        """Start taking sums (and checking around GPU copies); the tasks to cancel at stop: the one that stops
        passes whose client went quiet, and the background scrub's when ``--scrub-rate`` asks for one."""
        self.remote = remote
        self.integrity.start(loop)
        if gpu_mover is not None:
            gpu_mover.integrity = self.integrity
        tasks = [loop.create_task(self.passes.reap())]
        if not self.scrub_rate:
            return tasks
        logs.info("scrub_background", rate=self.scrub_rate)
        return [*tasks, loop.create_task(self.scrubber.run_background(self.scrub_rate))]

    def _holds_chunks(self, namespace: str) -> bool:
        if self.kept_waiting is not None and self.kept_waiting(namespace):
            return True
        return any(e.namespace == namespace and e.readable for e in self.store.index.values())

    def verified(self, namespace: str, keys: Sequence[bytes], checks: int, mismatches: int,
                 max_difference: float, first_bad: int | None) -> int:
        """Count a connector's comparison; on a mismatch drop the chain from the first bad chunk. Returns the
        chunks dropped."""
        v = self.verify
        v.reports += 1
        v.checks += checks
        v.mismatches += mismatches
        v.max_difference = max(v.max_difference, max_difference)
        if not mismatches or first_bad is None:
            return 0
        bad = list(keys[first_bad:])
        dropped = self.store.damage.drop_keys(bad)
        if self.remote is not None:
            self.remote.forget(bad)   # the store holds the same bytes: never fetch them back
        v.dropped += dropped
        logs.warning("verify_mismatch", namespace=namespace, checks=checks, mismatches=mismatches,
                     max_difference=max_difference, dropped=dropped, first=bad[0].hex())
        return dropped

    def stats(self) -> dict[str, Any]:
        integrity = asdict(self.store.damage.counters)
        if self.remote is not None:   # values the store returned that failed their record's checks
            integrity["corrupt_remote"] += int(self.remote.backend.stats().get("corrupt", 0))
        return {"integrity": {**integrity, "sums_pending": len(self.integrity.pending), "reported": self.reported},
                "scrub": self.scrubber.stats(), "verify": asdict(self.verify)}

    def close(self) -> None:
        self.integrity.close()
