"""The simulator's movers: the daemon's ledgers (``store/ledgers/``) driven by movers whose transfers complete
the moment they start.

Each takes the place of the daemon's mover of the same tier (``tiers/disk/mover.py``, ``tiers/gpu/mover.py``) on the
same ledger and asks it the same questions in the same order; only the I/O is gone. So the replay shows what the
daemon's bookkeeping does with a trace, assuming the disk and the GPU copies keep up: the capacity question, not
the bandwidth one (``bench/disk.py`` answers that).

When they run, as in the daemon: the disk mover writes as soon as the ledger wakes it (inside the commit, as the
disk mover's writers start) and drops DRAM copies past the host watermark after every write, as the disk
mover does; a promotion from disk reads at once. The GPU mover is woken by the gets that ask for promotions
but, like the daemon's task, acts only once the request is answered: ``settle`` runs its round.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import StoreFullError
from ..store.ledgers.disk import DiskLedger
from ..store.entry import Entry
from ..store.ledgers.gpu import GpuLedger


class InstantDiskMover:
    """The disk mover, every write and read complete at once (and never failing)."""

    def __init__(self, ledger: DiskLedger) -> None:
        self.ledger = ledger
        ledger.mover = self

    def wake(self) -> None:
        ledger = self.ledger
        write = ledger.next_write()
        while write is not None:
            ledger.finish_write(write.chunk, write.chunk.size, None)
            write = ledger.next_write()
        ledger.rebalance()

    def remove_file(self, key: bytes, quarantine: str | None = None) -> None:
        pass   # payload-less: there is no file

    def promote(self, entries: Sequence[Entry]) -> None:
        """Read disk-only chunks into DRAM (``DiskMover.promote``), stopping where DRAM has no room."""
        for entry in entries:
            if self.ledger.start_promote(entry) is None:
                break
            self.ledger.finish_promote(entry, None)


class InstantGpuMover:
    """The GPU mover, every copy complete at once."""

    def __init__(self, ledger: GpuLedger) -> None:
        self.ledger = ledger
        self.woken = False
        ledger.mover = self

    def wake(self) -> None:
        self.woken = True

    def settle(self) -> None:
        """The mover's round (``GpuMover.step``): every promotion asked for, then the watermark."""
        self.woken = False
        ledger = self.ledger
        for entry in ledger.promotions(len(ledger.wanted)):
            if ledger.start_promote(entry) is not None:
                ledger.finish_promote(entry, True)
        ledger.shed(self._demote)

    def _demote(self, entry: Entry) -> bool:
        try:
            host_offset = self.ledger.start_demote(entry)
        except StoreFullError:
            return False   # DRAM holds only pinned chunks: as the mover, try again next round
        if host_offset is not None:
            self.ledger.finish_demote(entry, True)
        return True
