"""The mover life cycle (``tiers/mover_life.py``): waits are ``Condition.wait_for`` on completions, never a timer, and
``drain`` keeps its deadline. The GPU mover sleeps until its ledger wakes it (no idle poll). Real Store, real
ledgers, payload-less tiers; no daemon process."""

from __future__ import annotations

import asyncio
import time

from kvstore.tiers.gpu.mover import GpuMover
from kvstore.tiers.mover_life import MoverLife
from kvstore.store.store import Store
from kvstore.tiers.host.tier import HostTier
from kvstore.store.ledgers.builder import tier_ledgers
from kvstore.tiers.virtual import VirtualArena

PAGE = 4096


class Counting(MoverLife):
    """A mover whose one operation in flight the test ends, counting how often its idle state is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def idle(self) -> bool:
        self.asked += 1
        return super().idle()


def test_drain_waits_for_completion_without_polling():
    async def main() -> tuple[bool, float, int]:
        mover = Counting()
        mover.start(asyncio.get_running_loop())
        mover.in_flight[b"k"] = asyncio.get_running_loop().create_future()

        def complete() -> None:
            del mover.in_flight[b"k"]
            mover.changed()

        # The completion comes 0.3 s on: the window in which a polling drain would ask idle() again and again.
        asyncio.get_running_loop().call_later(0.3, complete)
        done = await mover.drain(time.monotonic() + 30)
        return done and not mover.in_flight, mover.asked

    done, asked = asyncio.run(main())
    assert done   # returned once the operation ended, not before
    assert asked <= 4, f"idle() asked {asked} times in 0.3 s: the drain polled"


def test_drain_keeps_its_deadline():
    async def main() -> tuple[bool, float, float]:
        mover = Counting()
        mover.start(asyncio.get_running_loop())
        mover.in_flight[b"k"] = asyncio.get_running_loop().create_future()   # never ends
        deadline = time.monotonic() + 0.2
        done = await asyncio.wait_for(mover.drain(deadline), 30)   # returns at all: it kept its deadline
        return done, deadline, time.monotonic()

    done, deadline, returned = asyncio.run(main())
    assert not done and returned >= deadline - 0.01   # not before it either (the loop's timer resolution aside)


def test_gpu_mover_sleeps_until_its_ledger_wakes_it():
    store = Store(HostTier(VirtualArena(64 * PAGE)), 10.0, 10.0, tier_ledgers(gpu=HostTier(VirtualArena(16 * PAGE))))

    async def main() -> tuple[int, int, int]:
        mover = GpuMover(store.gpu_ledger, store.host)
        steps = 0
        step = mover.step

        woken = asyncio.Event()

        def counted() -> None:
            nonlocal steps
            steps += 1
            if steps > 1:
                woken.set()
            step()

        mover.step = counted
        mover.start(asyncio.get_running_loop())
        await asyncio.sleep(0.6)   # the point: a window in which a polling mover would take rounds
        idle_steps = steps
        handle, _ = store.reserve(b"o", "ns", [b"a" * 16], [PAGE], None)
        store.commit(b"o", handle.id)
        for _ in range(2):   # the second get that finds the chunk in DRAM asks for its promotion
            lease, _ = store.get(b"o", [b"a" * 16])
            store.release(b"o", lease.id)
        await asyncio.wait_for(woken.wait(), 30)
        woken_steps = steps
        drained = await mover.drain(time.monotonic() + 1)
        return idle_steps, woken_steps, drained

    idle_steps, woken_steps, drained = asyncio.run(main())
    assert idle_steps == 1, f"{idle_steps} rounds in 0.6 s with nothing to do: the mover polled"
    assert woken_steps > idle_steps, "a promotion request did not wake the mover"
    assert drained and not store.gpu_ledger.wanted
