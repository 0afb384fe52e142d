"""The ledgers of the tiers below DRAM, built together and handed to one Store (``store/ledgers/base.py`` says what a
ledger is). Whoever builds a Store builds these first: the daemon (``server/lifecycle/tier_setup.py``), the simulator
(``sim/replay.py``) and tests alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import TierLedger
from ..policies import DEFAULT_POLICY
from .disk import DiskLedger
from ...tiers.disk.tier import DiskTier
from .gpu import GpuLedger
from .remote import RemoteLedger


@dataclass(frozen=True)
class TierLedgers:
    """One ledger per tier below DRAM that the Store has (the remote one always: it sends nothing until a remote
    mover attaches to it), and the eviction policy every tier's queue follows."""

    policy: str
    remote: RemoteLedger
    disk: DiskLedger | None = None
    gpu: GpuLedger | None = None

    def in_hook_order(self) -> list[TierLedger]:
        """Disk, GPU, remote: a commit is queued for the disk before it is sent to the remote store."""
        return [t for t in (self.disk, self.gpu, self.remote) if t is not None]


def tier_ledgers(policy: str = DEFAULT_POLICY, disk: DiskTier | None = None, gpu: Any = None) -> TierLedgers:
    """The ledgers of the tiers given (``gpu``: a ``GpuTier``, or an allocator in tests and the simulator), their
    queues in the order of ``policy`` (``store/policies.py``)."""
    return TierLedgers(policy, RemoteLedger(),
                       DiskLedger(disk, policy) if disk is not None else None,
                       GpuLedger(gpu, policy) if gpu is not None else None)
