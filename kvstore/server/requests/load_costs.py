"""What loading a KiB costs from each tier the engines' clients read themselves, as they report it.

A router weighs a block held in each medium by what loading it costs (``kvstore/routing/events_router.py``). The
daemon reads the disk tier itself and times those reads (``STORAGE``); a DRAM or GPU-tier hit never passes through
the daemon, since the engine's client copies it out of the arena or the GPU pool. The connectors therefore time
their own loads — from asking for the chunks to the end of the copy into the engine's KV cache — and tell the
daemon the sums per medium now and then (``LOAD_TIMES``, reply-less, like the notes of shared-index lookups).
The daemon publishes the cost since start per medium in ``stats`` (``load_ns_per_kib``) and on ``/metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...protocol.messages import LOAD_MEDIA, LoadTimes


@dataclass
class MediumLoads:
    """One medium's loads since start."""

    nbytes: int = 0
    ns: int = 0

    def ns_per_kib(self) -> int | None:
        """Nanoseconds per KiB loaded, or None before the first KiB."""
        kib = self.nbytes / 1024
        return int(self.ns / kib) if kib >= 1 else None


@dataclass
class LoadCosts:
    """The clients' reported loads, per medium (``LOAD_MEDIA``)."""

    media: dict[str, MediumLoads] = field(default_factory=lambda: {m: MediumLoads() for m in LOAD_MEDIA})

    def add(self, times: LoadTimes) -> None:
        """Count one client's note (already checked by ``LoadTimes.parse``)."""
        for medium, nbytes, ns in zip(times.media, times.nbytes, times.ns):
            loads = self.media[medium]
            loads.nbytes += nbytes
            loads.ns += ns

    def ns_per_kib(self) -> dict[str, int]:
        """The cost per medium measured so far (media nobody has loaded from are left out)."""
        costs = {m: loads.ns_per_kib() for m, loads in self.media.items()}
        return {m: c for m, c in costs.items() if c is not None}
