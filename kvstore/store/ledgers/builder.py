"""The ledgers of the tiers below DRAM: what each is built from (``TierSpecs``, from ``tier_ledgers``) and their
construction by the one Store they keep the books of (``TierSpecs.build``, ``store/ledgers/base.py`` says what a
ledger is). Whoever builds a Store names its lower tiers with ``tier_ledgers``: the daemon
(``server/lifecycle/tier_setup.py``), the simulator (``sim/replay.py``) and tests alike; the Store builds each ledger
from its constructor, handing it the protocol that ledger uses and nothing later."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .base import TierLedger
from ..policies import DEFAULT_POLICY
from .disk import DiskLedger, DiskStore
from ...tiers.disk.tier import DiskTier
from .gpu import GpuLedger
from .remote import RemoteLedger, RemoteStore


class LedgersStore(DiskStore, RemoteStore, Protocol):
    """What the Store is to its ledgers: every ledger's protocol at once (each ledger keeps only its own)."""


@dataclass(frozen=True)
class TierSpecs:
    """The tiers below DRAM a Store has (``gpu``: a ``GpuTier``, or an allocator in tests and the simulator), and
    the eviction policy every tier's queue follows."""

    policy: str
    disk: DiskTier | None = None
    gpu: Any = None

    def build(self, store: LedgersStore) -> Ledgers:
        """The ledgers of these tiers for ``store`` (called once, from its constructor)."""
        disk = DiskLedger(store, self.disk, self.policy) if self.disk is not None else None
        gpu = GpuLedger(store, self.gpu, self.policy, disk) if self.gpu is not None else None
        return Ledgers(RemoteLedger(store), disk, gpu)


@dataclass(frozen=True)
class Ledgers:
    """One ledger per tier below DRAM that the Store has (the remote one always: it sends nothing until a remote
    mover attaches to it)."""

    remote: RemoteLedger
    disk: DiskLedger | None = None
    gpu: GpuLedger | None = None

    def in_hook_order(self) -> list[TierLedger]:
        """Disk, GPU, remote: a commit is queued for the disk before it is sent to the remote store."""
        return [t for t in (self.disk, self.gpu, self.remote) if t is not None]


def tier_ledgers(policy: str = DEFAULT_POLICY, disk: DiskTier | None = None, gpu: Any = None) -> TierSpecs:
    """What the ledgers of the tiers given are built from, their queues in the order of ``policy``
    (``store/policies.py``)."""
    return TierSpecs(policy, disk, gpu)
