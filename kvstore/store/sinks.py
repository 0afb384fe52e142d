"""What the Store tells the observers of every change to its index: the lookup index it publishes to local
clients in shared memory (``mapped/index_writer.py``), the KV cache event log (``events.py``) and the checksummer
(``integrity.py``). Protocols, so none of these modules is imported back into ``store.py``."""

from __future__ import annotations

from typing import Protocol, Sequence

from .entry import Entry


class IndexSink(Protocol):
    """Where the Store publishes each key's readable state for clients (``mapped/index_writer.py``)."""

    def set(self, key: bytes, state: int, host: int | None = None, size: int = 0) -> None: ...

    def set_many(self, items: Sequence[tuple[bytes, int, int | None, int]]) -> None: ...

    def remove(self, key: bytes) -> None: ...


class EventSink(Protocol):
    """Where the Store tells each key's readable entry after every change (``events.py``: KV cache events)."""

    def changed(self, key: bytes, entry: Entry | None) -> None: ...

    def changed_many(self, items: Sequence[tuple[bytes, Entry | None]]) -> None: ...

    def all_cleared(self) -> None: ...


class SumSink(Protocol):
    """What the Store tells the checksummer (``integrity.py``): take these committed chunks' sums, then call
    ``Store.checksummed``."""

    def after_commit(self, entries: list[Entry]) -> None: ...
