"""Property test of the Store's accounting: random operation sequences, every invariant checked after each step.

The Store runs as the daemon wires it (its disk, GPU and remote ledgers, a checksummer behind ``sums``, the
shared index behind ``published``), over payload-less tiers (``tiers/virtual.py``): a small host arena, a small
GPU pool and a small disk, so that eviction, demotion and skipped writes happen often. No daemon process runs;
the test is every ledger's mover: it records what the ledgers wake it for, asks the ledgers for work as the
movers do, and finishes the transfers in any order, successfully or not, so every interleaving of intents and
completions is tried.

Checked after every step: every extent of every allocator belongs to exactly one entry field (``host_offset``,
``loading``, ``gpu_offset``, ``gpu_loading``); the disk tier's charge is the sum of the entries' footprints; the
write-back byte count matches its queue; every promotion request names an indexed chunk, every queued remote
put was handed to its mover, and the Store holds no mover; every eviction queue holds only entries it may evict
(indexed, readable, unleased, holding a copy in its tier); a leased chunk keeps the copy its get returned; the published
index says exactly what the index says.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from support.store_machine import StoreMachine


StoreMachine.TestCase.settings = settings(max_examples=250, stateful_step_count=80, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow], derandomize=True,
                                          database=None)
TestStoreProperties = StoreMachine.TestCase


def test_a_chunk_deleted_while_written_to_disk_leaves_the_gpu_queue_at_once():
    """Found by the machine above: a chunk with a GPU copy, deleted while its disk write ran, stayed in the GPU
    tier's eviction queue (a demotion could then have copied an unindexed chunk back down)."""
    state = StoreMachine()
    steps = [
        lambda: state.start(deferred=False, disk_pages=8, gpu_pages=4, host_pages=6, policy="chain-lru",
                            remote=False, summed=False),
        lambda: state.put(first=0, length=1, pages=1, then_write=False),
        lambda: state.get(first=0, gpu_ok=False, length=1, owner=b"a"),
        lambda: state.get(first=0, gpu_ok=False, length=1, owner=b"a"),   # the second hit asks for promotion
        state.promote_wanted,
        state.start_write,
        lambda: state.drop_owner(owner=b"a"),
        lambda: state.delete(first=0, length=1),
    ]
    for step in steps:
        step()
        state.accounting_holds()
    assert len(state.gpu.lru) == 0
