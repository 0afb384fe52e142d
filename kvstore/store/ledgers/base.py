"""The interface between the Store and the tiers below DRAM: the hooks a tier's ledger answers.

A tier below DRAM (disk, GPU, remote) is two objects, side by side in its package under ``tiers/``. Its *ledger*
(``store/ledgers/disk.py``, ``store/ledgers/gpu.py``, ``store/ledgers/remote.py``) is the only code that changes that
tier's fields of an ``Entry`` and its queues, and records intents (write this chunk, promote that one, send
these); its *mover* (``tiers/disk/mover.py``, ``tiers/gpu/mover.py``, ``tiers/remote/mover.py``;
``sim/movers.py`` in the simulator) does the I/O those intents ask for and reports back to
the ledger, and to nobody else. The Store (``store.py``) keeps the index, leases, reservations and the DRAM arena,
and calls every ledger through the hooks below at the moments a lower tier must hear of; it never calls a mover.

The hooks run on the event loop, inside the Store's own operation: they must not block, and they must not call
back into the operation that called them (a ledger that wants its mover to act *wakes* it: ``Mover.wake``).

Trade-off: a fixed list of hooks instead of per-tier calls in the Store costs a loop over two or three ledgers
per hook; in exchange the Store reads as one thing (the index and DRAM) and a tier is added by writing a ledger
and a mover, without touching ``store.py``.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from ...tiers.ledger_api import Wakeable as Mover   # what a ledger asks of its mover: wake it

__all__ = ["FillStore", "LedgerStore", "Mover", "TierLedger"]
from ..counters import TierCounters
from ..entry import Entry


class DamagePath(Protocol):
    """What a ledger may ask of the Store's damage path (``damage.Damage``)."""

    def damaged(self, entry: Entry, tier: str) -> int: ...


class AdmitPath(Protocol):
    """What a ledger may ask of the Store's put path (``puts.Puts``): publish chunks it filled itself."""

    def admit(self, entries: list[Entry], source: "TierLedger") -> None: ...


class LedgerStore(Protocol):
    """What every ledger may ask of the Store that builds it (``store.py``): the index, the DRAM arena, each
    tenant's budgets, the tier counters and the one set of slot primitives. Each ledger's own protocol
    (``DiskStore``, ``GpuStore``, ``RemoteStore``) adds what only it uses; the Store fits them all, and hands
    itself as that protocol when it constructs the ledger. Written out so that no ledger imports the Store."""

    @property
    def index(self) -> dict[bytes, Entry]: ...
    @property
    def host(self) -> Any: ...                    # tiers.host.HostTier
    @property
    def budgets(self) -> Any: ...                 # tenant_budgets.TenantBudgets: each tenant's bytes in every tier
    @property
    def tier_counters(self) -> TierCounters: ...

    def leading(self, keys: Sequence[bytes]) -> list[Entry]: ...
    def sync(self, key: bytes) -> None: ...
    def allocate_host(self, size: int, owner: bytes | None = None, taken: Sequence[Entry] = (),
                      namespace: str | None = None) -> int: ...
    def release_if_idle(self, entry: Entry) -> None: ...


class FillStore(LedgerStore, Protocol):
    """What a ledger that fills DRAM slots itself (a promotion, a copy down) asks of the Store."""

    def fill_host(self, entry: Entry, offset: int, evictable: bool = True) -> None: ...


class TierLedger:
    """A lower tier's hooks, each a no-op here: a ledger overrides those its tier cares about. A ledger is built by
    the Store it keeps the books of (``builder.py``), handed at construction only the protocol it uses."""

    name = ""

    def budgets_changed(self) -> None:
        """The tenants table was replaced (``Store.set_tenants``): take this tier's queue again from the Store's
        budgets, if it keeps one."""

    def refusal(self) -> str:
        """Why puts must fail now ("" when they need not): e.g. the disk's filesystem is full."""
        return ""

    def on_commit(self, entries: Sequence[Entry]) -> None:
        """These chunks were just committed by a put (their checksums taken): readable, each in a DRAM slot."""

    def on_touch(self, entries: Sequence[Entry]) -> None:
        """A lookup found this chain (prefix first): it is the most recently used."""

    def on_hit(self, entries: Sequence[Entry]) -> None:
        """A get is about to lease these chunks."""

    def on_pin(self, entry: Entry) -> None:
        """``entry`` got its first pin: it must not leave this tier until unpinned."""

    def on_unpin(self, entries: Sequence[Entry]) -> None:
        """These chunks lost their last pin (and are still indexed): they may leave this tier again."""

    def uses_dram(self, entry: Entry) -> bool:
        """Whether this tier's I/O reads or fills ``entry``'s DRAM slot now (so the slot must stay)."""
        return False

    def keeps(self, entry: Entry) -> bool:
        """Whether this tier holds a copy of ``entry`` that survives its DRAM copy."""
        return False

    def on_leave_dram(self, entry: Entry, kept: bool) -> None:
        """``entry``'s DRAM copy is about to go; ``kept``: some tier keeps the chunk (else it is evicted)."""

    def on_remove(self, entry: Entry) -> None:
        """``entry`` left the index (deleted, evicted, dropped): out of this tier's queues and requests."""

    def on_free(self, entry: Entry) -> None:
        """Nothing uses ``entry`` any more, or its chunk is evicted: give this tier's copy back."""
