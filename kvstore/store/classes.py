"""Retention classes across the tiers: ``RetentionClasses``, the collaborator the Store owns for them
(``Store.retention``).

Until the first chunk with a class other than ``normal`` (a put asked for one, or a restart found one), every
tier's queues are plain and a daemon pays nothing for classes; then ``split_queues`` wraps each queue of every tier
in a ``RetentionQueue`` (``retention.py`` says how the order and the soft pins work). A change of class
(``reclass``) moves a chunk in every tier's queue at once, since one ``Entry.retention`` routes it in all of them,
and writes its DRAM copy's journal record again when the class that record keeps changed. Pins past their deadline
become ``high`` chunks (``expire_pins``: a heap pop each).

``RetentionClasses`` owns whether the queues are split (``split``) and the soft pins (``soft_pins``), and is given
only what it uses of the Store (``ClassStore``, which the Store fits): its queues, the ledgers that keep queues
too, and the journal of DRAM copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from ..defaults import MAX_PIN_SHARE, MAX_PIN_TTL, PIN_TTL
from ..protocol.retention import Retention, RetentionAsk
from .entry import Entry
from .policies import make_queue
from .retention import RetentionQueue, SoftPins, stored_class

if TYPE_CHECKING:
    from .eviction import EvictionQueue
    from .tenant_budgets import TenantBudgets


@dataclass(frozen=True)
class PinSettings:
    """The bounds of soft pins (``store/retention.py``): default and longest TTL in seconds, and the share of DRAM
    all pins may hold without a tenants table."""

    default_ttl: float = PIN_TTL
    max_ttl: float = MAX_PIN_TTL
    max_share: float = MAX_PIN_SHARE


DEFAULT_PINS = PinSettings()


class Queued(Protocol):
    """A lower tier's ledger as far as classes go: the queue it keeps (``DiskLedger``, ``GpuLedger``)."""

    @property
    def lru(self) -> EvictionQueue: ...


class Journal(Protocol):
    """Where a DRAM copy's record is written again when its class changes (``kept.KeptCopies``)."""

    def journal_commits(self, entries: Sequence[Entry]) -> None: ...


class ClassStore(Protocol):
    """What retention classes use of the Store: the queues of every tier and the journal of DRAM copies."""

    @property
    def lru(self) -> EvictionQueue: ...
    @property
    def disk_ledger(self) -> Queued | None: ...
    @property
    def gpu_ledger(self) -> Queued | None: ...
    @property
    def kept(self) -> Journal: ...   # the journal of DRAM copies, which records each one's class

    def queues_changed(self) -> None: ...


class RetentionClasses:
    """The retention classes of one Store (see the module docstring)."""

    def __init__(self, store: ClassStore, budgets: TenantBudgets, policy: str, capacity: int,
                 clock: Callable[[], float], pins: PinSettings) -> None:
        """The classes of ``store``'s chunks, whose queues ``budgets`` hold in the order of ``policy``.

        Args:
            capacity: the bytes of DRAM, which pins may hold a share of (``pins.max_share``) without tenants.
            clock: the time pins' deadlines are measured on.
            pins: the bounds of soft pins (retention class ``pin``).
        """
        self.store = store
        self.budgets = budgets
        self.policy = policy
        self.split = False   # whether every tier's queues are split by retention class (``split_queues``)
        self.soft_pins = SoftPins(budgets, capacity, clock, pins.default_ttl, pins.max_ttl, pins.max_share)

    def split_queues(self) -> None:
        """Split every queue of every tier (DRAM's, the disk's, the GPU tier's: the shared one and each tenant's
        parked one, ``tier_guard.py``) by retention class, each queue as it stands becoming its ``normal`` class,
        the first time a chunk has another class (a put asked for one, or a restart found one:
        ``store/retention.py``): until then a daemon pays nothing for classes. Pins are kept out of DRAM's
        victims only; on disk and in the GPU tier a pinned chunk is ``high``."""
        if self.split:
            return
        self.split = True
        make = partial(make_queue, self.policy)
        for tier, guard in self.budgets.guards.items():
            guard.wrap_queues(partial(RetentionQueue, make, pins=tier == "dram"))
        self.store.queues_changed()   # the Store and each ledger take their tier's queue again

    def class_queues(self) -> list[EvictionQueue]:
        """The queue of every tier that orders chunks by class (all of them once ``split``)."""
        queues = [self.store.lru]
        for ledger in (self.store.disk_ledger, self.store.gpu_ledger):
            if ledger is not None:
                queues.append(ledger.lru)
        return queues

    def reclass(self, entry: Entry, change: Callable[[], object]) -> None:
        """Run ``change`` (which sets ``entry.retention``), moving ``entry`` to its new class's queue in every tier
        that queues it. A DRAM copy's journal record is written again when the class it keeps changed."""
        kept = stored_class(entry)
        queued = [queue for queue in self.class_queues() if entry in queue]
        for queue in queued:
            queue.remove(entry)
        change()
        for queue in queued:
            queue.add_chain([entry])
        if stored_class(entry) is not kept and entry.readable:
            self.store.kept.journal_commits([entry])

    def raise_to(self, entry: Entry, cls: Retention) -> None:
        """Give ``entry`` the class ``cls`` (higher than its own), in every tier's queue."""
        self.reclass(entry, partial(setattr, entry, "retention", cls))

    def unpin(self, entry: Entry) -> None:
        """``entry``'s pin ends (its DRAM copy goes, or its deadline passed): a ``high`` chunk from now on."""
        if entry.pin_until:
            self.reclass(entry, partial(self.soft_pins.unpin, entry))

    def expire_pins(self) -> None:
        """Pins past their deadline become ``high`` chunks (a heap pop each: ``SoftPins.due``)."""
        for entry in self.soft_pins.due():
            self.reclass(entry, partial(self.soft_pins.unpin, entry))
            self.soft_pins.counters.pins_expired += 1

    def apply(self, entries: Sequence[Entry], ask: RetentionAsk, fresh: bool = False) -> None:
        """Give chunks a put just published (``fresh``) the class ``ask`` names; chunks a put stored again are
        raised to it where it is higher (never lowered). A pin is made, or its deadline pushed back."""
        cls = ask.cls
        if cls is None or cls is Retention.NORMAL:
            return
        self.split_queues()
        for entry in entries:
            if cls is Retention.PIN and entry.host_offset is not None:
                self.reclass(entry, partial(self.soft_pins.pin, entry, ask.pin_ttl))
                continue
            held = Retention.HIGH if cls is Retention.PIN else cls   # a pin holds a DRAM copy: one held below is high
            if fresh and entry not in self.store.lru:
                entry.retention = held   # queued nowhere yet (lower tiers hear of it later): each queues it by class
            elif fresh or held > entry.retention:
                self.raise_to(entry, held)

    def count_no_store(self, chunks: int) -> None:
        """A ``no-store`` put was acknowledged: nothing stored, counted."""
        self.soft_pins.counters.no_store_puts += 1
        self.soft_pins.counters.no_store_chunks += chunks
