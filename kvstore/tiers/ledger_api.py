"""What a mover needs from the store side, declared here so that ``tiers/`` imports nothing from ``store/``.

A tier below DRAM is a *ledger* (``store/ledgers/``: the bookkeeping, on the event loop) and a *mover* (the I/O,
here under ``tiers/``). The store side depends on the tiers and never the other way round, so a mover is built
on the narrow interfaces below rather than on the Store's classes:

* ``Chunk`` is a chunk's record as a mover reads it (the Store's ``Entry`` matches it); a mover never changes
  one, it hands the record back to its ledger with what happened to it.
* ``DiskBooks``, ``GpuBooks`` and ``RemoteBooks`` are what each mover asks of its ledger: the next piece of work
  (``next_write``, ``promotions``, ``take_puts``), a slot to fill (``start_*``), and where to report the end of
  each transfer (``finish_*``, ``put_done``). Reports carry plain values (bytes stored, an error, a checksum, ok);
  the ledger decides what they mean for the index. Each is generic in the record type, so a ledger's methods
  take its own entries and the type checker still proves that it fits its mover.
* ``SlotChecks`` is the checksummer as the GPU mover uses it around its copies.
* ``DiskMoverHooks`` and ``Wakeable`` are the other direction: what a ledger may ask of its mover (wake it;
  remove a file in order with the writes). A mover connects itself to its ledger (``mover``) when it is built,
  or, for the remote mover, when it starts.

What a mover does not get: the Store, its index, its counters or its integrity book. What a check finds is
returned (``DiskMover.check_file`` says what it found; the caller counts it).
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Protocol, Sequence, TypeVar

from ..protocol.engine_blocks import EngineBlocks
from ..protocol.key_params import KeyParams
from ..protocol.retention import Retention

if TYPE_CHECKING:
    from .remote.book import RemoteBook


class Chunk(Protocol):
    """A chunk's record as a mover reads it (read-only: only its ledger changes it)."""

    @property
    def key(self) -> bytes: ...
    @property
    def size(self) -> int: ...
    @property
    def namespace(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def checksum(self) -> int | None: ...
    @property
    def host_offset(self) -> int | None: ...
    @property
    def gpu_offset(self) -> int | None: ...
    @property
    def loading(self) -> Any: ...   # the host offset being filled, while a copy down or a read fills one


C = TypeVar("C", bound=Chunk)


class Wakeable(Protocol):
    """What a ledger asks of every mover: act on the intents it just recorded."""

    def wake(self) -> None: ...


class DiskMoverHooks(Wakeable, Protocol):
    """What the disk ledger asks of its mover: start writing what is queued, and remove files in order with the
    writes (``quarantine``: the reason the file is kept aside instead)."""

    def remove_file(self, key: bytes, quarantine: str | None = None) -> None: ...


@dataclass(frozen=True)
class DiskWrite(Generic[C]):
    """One write the disk ledger hands its mover: the chunk, the host slot its bytes are in, and what its file's
    header records (the retention class a restart keeps, the key parameters of its namespace)."""

    chunk: C
    host_offset: int
    parent: bytes | None
    engine: EngineBlocks | None
    retention: Retention
    params: KeyParams | None


class DiskBooks(Protocol[C]):
    """What the disk mover asks of the disk ledger (``store/ledgers/disk.py``)."""

    mover: DiskMoverHooks | None

    @property
    def full_reason(self) -> str: ...   # "" unless the filesystem said ENOSPC
    @property
    def dirty(self) -> Sized: ...       # the chunks queued for write-back
    @property
    def dirty_bytes(self) -> int: ...   # their bytes, and those being checksummed or written

    def next_write(self) -> DiskWrite[C] | None: ...
    def finish_write(self, chunk: C, stored: int | None, error: BaseException | None) -> None: ...
    def rebalance(self) -> int: ...
    def over_bound(self, nbytes: int, bound: int) -> bool: ...
    def start_promote(self, chunk: C) -> int | None: ...
    def finish_promote(self, chunk: C, error: BaseException | None, checksum: int | None = None) -> bool: ...
    def space_back(self, free: int) -> bool: ...


class GpuBooks(Protocol[C]):
    """What the GPU mover asks of the GPU ledger (``store/ledgers/gpu.py``)."""

    mover: Wakeable | None

    @property
    def gpu(self) -> Any: ...            # tiers.gpu.tier.GpuTier (or an allocator, in tests)
    @property
    def wanted(self) -> Sized: ...       # the promotions asked for

    def promotions(self, limit: int) -> list[C]: ...
    def shed(self, demote: Callable[[C], bool], leaving: Callable[[], int] = ...) -> int: ...
    def start_promote(self, chunk: C) -> int | None: ...
    def finish_promote(self, chunk: C, ok: bool) -> bool: ...
    def start_demote(self, chunk: C, to_host: bool = False) -> int | None: ...
    def finish_demote(self, chunk: C, ok: bool) -> None: ...


class RemoteBooks(Protocol[C]):
    """What the remote mover asks of the remote ledger (``store/ledgers/remote.py``)."""

    mover: Wakeable | None

    @property
    def book(self) -> RemoteBook: ...    # what each tenant with a remote ceiling wrote

    def take_puts(self) -> list[list[C]]: ...
    def put_done(self, chunks: Sequence[C]) -> None: ...
    def views(self, chunks: Sequence[C]) -> list[memoryview]: ...
    def known(self, key: bytes) -> bool: ...
    def readable_prefix(self, keys: Sequence[bytes]) -> int: ...
    def start_fetch(self, namespace: str, keys: Sequence[bytes], sizes: Sequence[int],
                    parent: bytes | None) -> list[C]: ...
    def finish_fetch(self, chunks: Sequence[C], loaded: int, sums: Sequence[int | None] = ()) -> int: ...


class SlotChecks(Protocol[C]):
    """The checksummer (``store/integrity.py``) as the GPU mover uses it: re-check host slots before a copy up,
    sum a new slot after a copy down (both off the event loop), and hand copies that failed to the damage path."""

    async def check_host(self, chunks: Sequence[C]) -> list[C]: ...
    async def sum_slot(self, view: memoryview) -> int: ...
    def report(self, bad: Sequence[C], tier: str, why: str) -> int: ...
