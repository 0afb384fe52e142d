"""The remote mover: write-back to a remote store after commit, and promotion from it when a lookup misses.

A remote store (Redis/Valkey, Mooncake Store; ``kvstore/tiers/remote/``) sits below the disk tier and is shared by the
daemons of several hosts: what one host's engines computed, another host's engines can load.

Write-back at commit. Every chunk a put commits is sent in the background, one batched put per commit, straight
from its host slot (zero-copy on Mooncake, whose client reads the registered arena). The remote ledger
(``store/ledgers/remote.py``, seen through ``RemoteBooks``: ``tiers/ledger_api.py``) pins the chunks at commit and
queues the put, then wakes this mover; they stay pinned until the put ends, so that their slots are neither freed
nor reused while a worker reads them. Commit rather than "once on disk": another host can find a chunk as early as
possible, the disk and the remote store are written in parallel from the same slot, and a daemon without a disk
tier shares its chunks too.
Chunks fetched from the remote store, and chunks found on disk at start, are not sent again. The bytes pinned by
puts in flight are bounded by the backend's ``max_pending_bytes`` (a quarter of the host tier at most): a commit
past the bound, or one made while the store is down, is not sent (counted as ``put_dropped``) rather than pinning
DRAM that puts need. The remote copy is a cache, not a journal.

Remote ceilings. A tenant with a ``remote`` ceiling has its puts booked (``book.py``: the values this daemon wrote
for it and has not deleted or seen missing, an upper bound of what the store keeps of them): a put that would take
the tenant past its ceiling first deletes the tenant's oldest values from the store, and is sent once the delete
succeeded; a failed delete, or a ceiling the tenant's landed values cannot make room under, drops the put
(counted), as a full queue does.

Promotion at lookup. When a lookup's local walk stops at a miss, the chain's continuation is asked of the store in
one batched metadata call (``batch_lookup``: the payload sizes of the leading chunks it holds). The Store reserves
host slots of exactly those sizes (RESERVED entries, invisible to readers), and one batched read fills them
(``batch_get_into``). The leading run that arrived whole and intact is published and queued for the disk like a
put; the rest is freed. The lookup waits for the metadata answer at most ``--remote-wait`` and counts those chunks
as tier "remote"; the data transfer continues in the background, and a get of those chunks waits for it (bounded
by its ``wait_ms``) as a get of disk-only chunks waits for their reads. Chunks already being fetched are counted,
never asked for twice. A lookup that found every chunk locally never talks to the store: a slow store cannot slow
a local hit.

Bad values. A value the store lists but that cannot be read back whole and intact (a checksum failure, a value
replaced in between) is remembered for ``BAD_TTL`` seconds (at most ``BAD_MAX`` keys), so that lookups stop
offering a chunk that every get would then miss; a chunk an engine's verification found wrong (its checksum
holds: the bytes were wrong from the start) for ``VERIFY_BAD_TTL``.

Checksums. A put carries each chunk's own checksum (taken at commit) into the record instead of computing one
from the slot, so DRAM damaged between commit and put gives a record that fails on read. A fetch returns the
records' checked sums, which become the fetched chunks' checksums: one xxh3 pass per transfer either way.

Failure. Every store call has a deadline and runs on the backend's worker pool (the one executor of the remote
path), awaited here, never on the event loop. While the store
is down the backend answers at once (its breaker, ``tiers/remote/base.py``) and probes it now and then, so lookups fall
back to the local tiers within one deadline and the remote tier returns by itself with the store.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Generic

from ... import logs
from ..ledger_api import C, RemoteBooks
from ..mover_life import MoverLife
from . import record
from .book import Plan

MAX_FETCH = 256          # chunks asked for in one lookup (the Store also stops at half the host tier)
BAD_TTL = 60.0           # seconds a value that could not be read back is not offered again
BAD_MAX = 4096
VERIFY_BAD_TTL = 3600.0  # seconds a chunk a verification found wrong is not fetched from the store again
DRAIN_MAX = 5.0          # at stop, how long puts in flight may take to finish


class RemoteMover(MoverLife, Generic[C]):
    def __init__(self, ledger: RemoteBooks[C], backend: Any, chunk_limit: int) -> None:
        """The mover of ``ledger``'s remote tier over ``backend`` (``tiers/remote/base.py``); a size the store
        reports past ``chunk_limit`` bytes is not believed."""
        super().__init__()   # ``in_flight``: key -> its fetch (result: chunks published)
        self.ledger = ledger
        self.backend = backend
        self.chunk_limit = chunk_limit
        self.bad: OrderedDict[bytes, float] = OrderedDict()   # key -> until when it is not offered
        self.puts_in_flight = 0
        self.pinned_bytes = 0
        self.lookups = 0          # lookups that asked the store
        self.lookup_chunks = 0    # chunks those lookups counted as remote hits
        self.lookup_late = 0      # answers that came after the lookup had replied
        self.remote_deletes_failed = 0   # deletes for a tenant's remote ceiling that failed (their puts dropped)
        self._tasks: set[asyncio.Task] = set()   # fetches, and deletes before a put (kept referenced)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        super().start(loop)
        self.ledger.mover = self   # from now on commits queue puts

    # -- write-back ---------------------------------------------------------------------------------------
    def wake(self) -> None:
        """Send the chains the ledger queued (pinned there), one batched put each (per tenant), held to its
        tenant's remote ceiling (``book.py``): its oldest values deleted from the store first where needed."""
        for chain in self.ledger.take_puts():
            for entries in _by_tenant(chain):
                self._book(entries)

    def _book(self, entries: list[C]) -> None:
        plan = self.ledger.book.plan(entries[0].tenant, [e.key for e in entries],
                                     [e.size + record.HEADER_SIZE for e in entries])
        if plan is None:   # refused at the tenant's ceiling (counted in the book)
            self.ledger.put_done(entries)
            return
        nbytes = sum(e.size for e in entries)
        self.puts_in_flight += 1
        self.pinned_bytes += nbytes
        if not plan.victims:
            self._send(entries, plan, nbytes)
            return
        assert self._loop is not None, "puts are queued only once the mover started"
        task = self._loop.create_task(self._delete_then_send(entries, plan, nbytes))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_then_send(self, entries: list[C], plan: Plan, nbytes: int) -> None:
        """Delete the plan's victims from the store, then send the put; a failed delete drops the put (the store
        may still hold the victims, so the put would pass the ceiling)."""
        try:
            removed = await self.backend.delete_async(plan.victim_keys)
        except Exception as exc:   # noqa: BLE001 - a bug here must not leave the chunks pinned
            logs.error("remote_delete_failed", error=repr(exc))
            removed = None
        if removed is None:
            self.ledger.book.restore(plan)
            self.remote_deletes_failed += 1
            self._put_finished(entries, nbytes, None)
            return
        self.ledger.book.deleted(plan)
        self._send(entries, plan, nbytes)

    def _send(self, entries: list[C], plan: Plan, nbytes: int) -> None:
        views = self.ledger.views(entries)
        fut = self.backend.submit_put([e.key for e in entries], views, sums=[e.checksum for e in entries])
        if fut is None:   # store down or queue full: counted by the backend
            self.ledger.book.unsent(plan)   # nothing was written (any victims are deleted already)
            self._put_finished(entries, nbytes, None)
            return
        fut.add_done_callback(lambda f: self.call_soon(self._put_finished, entries, nbytes, plan))

    def _put_finished(self, entries: list[C], nbytes: int, plan: Plan | None) -> None:
        """A put ended (``plan``: the one sent; None: not sent). What it wrote stays booked whatever the store
        answered: some of it may have been stored."""
        if plan is not None:
            self.ledger.book.landed(plan)
        self.puts_in_flight -= 1
        self.pinned_bytes -= nbytes
        self.ledger.put_done(entries)
        self.changed()

    def idle(self) -> bool:
        return not self.puts_in_flight

    async def drain(self, deadline: float) -> bool:
        """Wait (at stop) for the puts in flight, so that they reach the store and unpin their chunks (fetches
        are not waited for: their gets are answered at stop)."""
        return await self.wait_until(self.idle, min(deadline, time.monotonic() + DRAIN_MAX))

    # -- promotion ----------------------------------------------------------------------------------------
    async def continuation(self, namespace: str, keys: Sequence[bytes], start: int, wait: float) -> int:
        """How many of ``keys[start:]`` (the local walk stopped at ``start``) are being fetched or were found in
        the store within ``wait`` seconds; those found start their fetch into DRAM."""
        n = start
        while n < len(keys) and keys[n] in self.in_flight:
            n += 1
        if n == len(keys) or not self._worth_asking(keys[n]):
            return n - start
        self.lookups += 1
        sized: asyncio.Future = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._fetch(namespace, list(keys[n:n + MAX_FETCH]),
                                               keys[n - 1] if n else None, sized))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            found = await asyncio.wait_for(asyncio.shield(sized), wait)
        except asyncio.TimeoutError:
            self.lookup_late += 1
            found = 0
        self.lookup_chunks += found
        return n - start + found

    def pending(self, keys: Sequence[bytes]) -> list[asyncio.Future]:
        """The fetches in flight for the chunks right after the longest readable prefix of ``keys``."""
        futures: list[asyncio.Future] = []
        for key in keys[self.ledger.readable_prefix(keys):]:
            fut = self.in_flight.get(key)
            if fut is None:
                break
            if fut not in futures:
                futures.append(fut)
        return futures

    def _worth_asking(self, key: bytes) -> bool:
        if self.ledger.known(key):   # being written by a put: not ours to fetch
            return False
        until = self.bad.get(key)
        if until is None:
            return True
        if until > time.monotonic():
            return False
        del self.bad[key]
        return True

    async def _fetch(self, namespace: str, keys: list[bytes], parent: bytes | None, sized: asyncio.Future) -> None:
        loop = asyncio.get_running_loop()
        entries: list[C] = []
        done = loop.create_future()
        published = 0
        try:
            sizes = await self.backend.lookup_async(keys)
            if len(sizes) < len(keys) and self.backend.healthy:
                self.ledger.book.seen_missing(keys[len(sizes)])   # the store evicted it (or never had it)
            sizes = self._plausible(sizes)
            entries = self.ledger.start_fetch(namespace, keys[:len(sizes)], sizes, parent)
            for entry in entries:
                self.in_flight[entry.key] = done
            sized.set_result(len(entries))
            if entries:
                views = self.ledger.views(entries)
                sums: list[int | None] = []
                got = await self.backend.get_into_async([e.key for e in entries], views, None, sums)
                loaded = self._leading_whole(entries, got)
                published = self.ledger.finish_fetch(entries, loaded, sums)
                entries = []
        except Exception as exc:   # noqa: BLE001 - a bug here must not leave slots reserved forever
            logs.error("remote_fetch_failed", error=repr(exc))
            if not sized.done():
                sized.set_result(0)
        finally:
            if entries:
                self.ledger.finish_fetch(entries, 0)
            for key in keys:
                if self.in_flight.get(key) is done:
                    del self.in_flight[key]
            done.set_result(published)

    def _plausible(self, sizes: list[int]) -> list[int]:
        """The leading sizes a chunk can have here (the store's answer is not trusted with our memory)."""
        out = []
        for size in sizes:
            if not 0 < size <= self.chunk_limit:
                break
            out.append(size)
        return out

    def _leading_whole(self, entries: list[C], got: list[int | None]) -> int:
        """How many leading chunks arrived whole; the first one that did not, while the store answers, is bad."""
        loaded = 0
        for entry, length in zip(entries, got):
            if length != entry.size:
                if self.backend.healthy:
                    self._remember_bad(entry.key)
                break
            loaded += 1
        return loaded

    def forget(self, keys: Sequence[bytes]) -> None:
        """Chunks found wrong by a verification: the store's copies (the same bytes) are not fetched again."""
        for key in keys:
            self._remember_bad(key, VERIFY_BAD_TTL)

    def _remember_bad(self, key: bytes, ttl: float = BAD_TTL) -> None:
        self.bad[key] = time.monotonic() + ttl
        self.bad.move_to_end(key)
        while len(self.bad) > BAD_MAX:
            self.bad.popitem(last=False)
        logs.debug("remote_value_unreadable", key=key.hex())

    # -- upkeep -------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        return {**self.backend.stats(), "lookups": self.lookups, "lookup_chunks": self.lookup_chunks,
                "lookup_late": self.lookup_late, "fetching_chunks": len(self.in_flight),
                "puts_in_flight": self.puts_in_flight, "pinned_bytes": self.pinned_bytes,
                "unreadable_keys": len(self.bad), "ceiling_deletes_failed": self.remote_deletes_failed}

    def close(self, wait: float = 5.0) -> None:
        """Close the backend (its calls get ``wait`` seconds to end): before the arena is unmapped."""
        self.backend.close(wait)


def _by_tenant(chain: list[C]) -> list[list[C]]:
    """``chain``'s entries by tenant, each part in chain order (one part, the chain itself, when all share one)."""
    parts: dict[str, list[C]] = {}
    for entry in chain:
        parts.setdefault(entry.tenant, []).append(entry)
    return list(parts.values())
