"""The GPU mover: promotions into the GPU tier and demotions out of it, as copies polled by event.

The Store decides and accounts (it allocates and frees every slot, see ``store.py``); the mover runs the copies.
A promotion copies a chunk's DRAM slot into a fresh GPU slot; a demotion either frees the GPU slot at once (the
chunk still has a DRAM or disk copy: the usual case, since promotion keeps the DRAM copy) or copies it into a
fresh DRAM slot first. Copies are queued on the tier's side streams (``tiers/gpu/copies.py``) and return a
``Transfer``; the mover's task polls ``Transfer.done()`` every millisecond while any is in flight and sleeps
otherwise, so the event loop never blocks on the GPU. Only when a copy is done does the Store publish the new
slot or free the old one: a reader never sees a half-copied chunk.

When it runs: when its ledger (``store/ledgers/gpu.py``) wakes it, after a get asked for promotions or once leased
chunks of a GPU tier above its high watermark were released; each round also keeps the GPU tier between its
watermarks (above the high one it demotes the least recently used unleased chunks until under the low one:
``GpuLedger.shed``). It sleeps on its condition otherwise (``mover_life.py``: no idle timer). It talks only to the
GPU ledger, through ``GpuBooks`` (``tiers/ledger_api.py``); its life cycle is every mover's (start, wake, drain,
close, stats).
A reader that cannot map the GPU pool (a tcp:// client, or one that did not ask for it) gets the chunks only the
GPU tier holds copied down first (``fetch_down``), bounded by its get's ``wait_ms``. On a CPU-backed tier
(tests) the copies complete as they are queued, through the same code.

Checksums (with ``integrity`` set, as in the daemon: the checksummer, seen through ``SlotChecks``): a chunk's DRAM
slot is checked against its checksum before it is copied up, so a GPU copy is only ever made of intact bytes (a
slot that fails goes to the damage path instead); a copy down is checked in its new DRAM slot before that slot is
published, and a GPU copy that fails is dropped (or the chunk with it, when it had no other copy). Both checks hash
on the checksummer's worker, never on the event loop; the copy up waits for its check, the copy down's slot stays
unpublished until its check ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic

from ... import logs
from ...errors import StoreFullError
from ..host.tier import HostTier
from ..ledger_api import C, GpuBooks, SlotChecks
from ..mover_life import MoverLife

POLL_S = 0.001        # while copies are in flight
MAX_IN_FLIGHT = 64    # promotions queued on the GPU at once


@dataclass(eq=False)
class Move(Generic[C]):
    entry: C
    up: bool                                # promotion (DRAM -> GPU) or demotion (GPU -> DRAM)
    transfer: Any                           # kvstore.tiers.gpu.copies.Transfer
    done: asyncio.Future | None = None      # demotions: resolved when the chunk is readable from DRAM


class GpuMover(MoverLife, Generic[C]):
    def __init__(self, ledger: GpuBooks[C], host: HostTier) -> None:
        """The mover of ``ledger``'s GPU tier, copying to and from slots of ``host`` (the DRAM tier)."""
        super().__init__()
        self.ledger = ledger
        self.gpu = ledger.gpu
        self.host = host
        self.moves: list[Move[C]] = []   # copies in flight; ``in_flight`` holds the copies down a get waits for
        self.leaving = 0   # bytes of GPU slots being copied down (freed when their copy ends)
        self._woken = False
        self._draining = False
        self._task: asyncio.Task | None = None
        self.integrity: SlotChecks[C] | None = None   # set by the daemon: check slots around every copy
        self._checking: asyncio.Task | None = None  # the check of the next promotions, while it runs
        ledger.mover = self

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        super().start(loop)
        self._task = loop.create_task(self._run())

    def wake(self) -> None:
        self._woken = True
        self.changed()

    async def _run(self) -> None:
        while True:
            self._woken = False
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - a bug here must not stop the tier
                logs.error("gpu_mover_error", error=repr(exc))
            if self.moves:
                await asyncio.sleep(POLL_S)   # a GPU copy has no completion the loop can wait on
                continue
            await self.wait_until(lambda: self._woken, None)

    def step(self) -> None:
        self._poll()
        if not self._draining:
            self._promote_wanted()
            self.ledger.shed(self._demote_for_room, lambda: self.leaving)
        self._poll()   # copies on a CPU tier are done at once

    # -- promotion --------------------------------------------------------------------------------------------
    def _promote_wanted(self) -> None:
        if self._checking is not None:
            return
        batch = self.ledger.promotions(MAX_IN_FLIGHT - len(self.moves))
        if not batch:
            return
        if self.integrity is None or self._loop is None:
            for entry in batch:
                self._promote(entry)
            return
        self._checking = self._loop.create_task(self._check_then_promote(batch))

    async def _check_then_promote(self, batch: list[C]) -> None:
        assert self.integrity is not None
        try:
            bad = await self.integrity.check_host(batch)
            self.integrity.report(bad, "host", "gpu promotion")
            for entry in batch:
                if entry not in bad:
                    self._promote(entry)
        finally:
            self._checking = None
            self.wake()

    def _promote(self, entry: C) -> None:
        offset = self.ledger.start_promote(entry)
        if offset is None:
            return
        try:
            transfer = self.gpu.copy_from_host(entry.host_offset, entry.size, offset)
        except Exception as exc:  # noqa: BLE001 - a failed copy leaves the chunk where it was
            logs.warning("gpu_promote_failed", key=entry.key.hex(), error=repr(exc))
            self.ledger.finish_promote(entry, False)
            return
        self.moves.append(Move(entry, True, transfer))

    # -- demotion ---------------------------------------------------------------------------------------------
    def _demote_for_room(self, entry: C) -> bool:
        try:
            self.demote(entry)
        except StoreFullError:
            return False   # DRAM is full of leased chunks: try again on the next round
        return True

    def demote(self, entry: C, to_host: bool = False) -> asyncio.Future | None:
        """Move one chunk out of the GPU tier (into DRAM, when ``to_host``, even if it is on disk). Returns the
        copy's future, or None when it left at once. Raises StoreFullError when it needs DRAM and DRAM has no
        room."""
        pending = self.in_flight.get(entry.key)
        if pending is not None:
            return pending
        if entry.gpu_offset is None or entry.loading is not None:
            return None
        gpu_offset = entry.gpu_offset
        host_offset = self.ledger.start_demote(entry, to_host)
        if host_offset is None:
            return None
        try:
            transfer = self.gpu.copy_to_host(gpu_offset, entry.size, host_offset)
        except Exception as exc:  # noqa: BLE001 - the chunk stays in the GPU tier
            logs.warning("gpu_demote_failed", key=entry.key.hex(), error=repr(exc))
            self.ledger.finish_demote(entry, False)
            return None
        assert self._loop is not None
        done = self._loop.create_future()
        self.in_flight[entry.key] = done
        self.leaving += entry.size
        self.moves.append(Move(entry, False, transfer, done))
        return done

    def fetch_down(self, entries: Sequence[C]) -> list[asyncio.Future]:
        """Copy chunks only the GPU tier holds into DRAM, for a reader that cannot map the GPU pool."""
        futures: list[asyncio.Future] = []
        if self._loop is None:
            return futures
        for entry in entries:
            try:
                fut = self.demote(entry, to_host=True)
            except StoreFullError:
                break
            if fut is not None:
                futures.append(fut)
        self._poll()
        return futures

    # -- completion -------------------------------------------------------------------------------------------
    def _poll(self) -> None:
        if not self.moves:
            return
        pending = []
        for move in self.moves:
            if move.transfer.done():
                self._finish(move, True)
            else:
                pending.append(move)
        self.moves = pending

    def _finish(self, move: Move[C], ok: bool) -> None:
        if move.up:
            self.ledger.finish_promote(move.entry, ok)
            self.changed()
            return
        entry = move.entry
        if ok and self.integrity is not None and self._loop is not None and entry.checksum is not None:
            self._loop.create_task(self._check_down(move))
            return
        self._finish_down(move, ok)

    async def _check_down(self, move: Move[C]) -> None:
        """Check a copy down in its new DRAM slot (not published yet, so nothing else can free it)."""
        assert self.integrity is not None
        entry = move.entry
        got = None
        try:
            view = self.host.read(entry.loading, entry.size)
            got = await self.integrity.sum_slot(view)
        finally:
            self._finish_down(move, got == entry.checksum)
        if got != entry.checksum:
            self.integrity.report([entry], "gpu", "gpu demotion")

    def _finish_down(self, move: Move[C], ok: bool) -> None:
        self.leaving -= move.entry.size
        self.in_flight.pop(move.entry.key, None)
        self.ledger.finish_demote(move.entry, ok)
        if move.done is not None and not move.done.done():
            move.done.set_result(ok)
        self.changed()

    def stats(self) -> dict[str, int]:
        return {"copies_in_flight": len(self.moves), "promotions_wanted": len(self.ledger.wanted),
                "bytes_leaving": self.leaving}

    def idle(self) -> bool:
        return not self.moves and not self.in_flight

    async def drain(self, deadline: float) -> bool:
        """At stop: start no more copies, let those in flight end (and be published), then stop the task."""
        self._draining = True
        self.wake()
        try:
            return await self.wait_until(self.idle, deadline)
        finally:
            if self._task is not None:
                self._task.cancel()
                self._task = None

    def close(self) -> None:
        """Wait for any copy still queued, so that the GPU pool and the arena can go."""
        for move in self.moves:
            move.transfer.wait()
        self.moves = []
