"""Kept batches hashed on several workers are still settled oldest first (``kvstore/store/adoption.py``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import xxhash

from kvstore.store import adoption
from kvstore.store.adoption import Adoption, AdoptionReport, KeptArena
from kvstore.tiers.host.description import KeptChunk

SIZE = 4096


class FakeStore:
    """What Adoption touches of the Store: reads of kept slots, publishing and dropping, in call order."""

    def __init__(self, data: bytearray) -> None:
        self.data = data
        self.populated: list[int] = []
        self.host = SimpleNamespace(read=lambda offset, size: memoryview(self.data)[offset:offset + size],
                                    arena=SimpleNamespace(populate=lambda offset, size: self.populated.append(offset)))
        self.damage = SimpleNamespace(counters=SimpleNamespace(corrupt_host=0))
        self.calls: list[tuple[str, list[int]]] = []
        self.kept = self   # the warm restart's side (``Store.kept``): this fake plays it too

    def adopt(self, chunks, hold_for):
        self.calls.append(("adopt", [c.offset // SIZE for c in chunks]))
        return list(chunks), 0

    def drop_unverified(self, chunks):
        self.calls.append(("drop", [c.offset // SIZE for c in chunks]))
        return 0

    def learn_params(self, namespace, params):   # the kept chunks' key parameters, learnt before verification
        pass


def test_batches_hashed_at_once_are_settled_in_order_and_a_corrupt_chunk_is_dropped(monkeypatch):
    monkeypatch.setattr(adoption, "BATCH_BYTES", 2 * SIZE)
    monkeypatch.setattr(adoption, "VERIFY_WORKERS", 3)
    data = bytearray(bytes(range(256)) * (8 * SIZE // 256))
    for n in range(8):
        data[n * SIZE] = n
    chunks = [KeptChunk(n.to_bytes(16, "little"), n * SIZE, SIZE, "ns", None,
                        xxhash.xxh3_64_intdigest(bytes(data[n * SIZE:(n + 1) * SIZE]))) for n in range(8)]
    data[3 * SIZE + 7] ^= 0xFF   # chunk 3 (the second batch) no longer matches its checksum
    store = FakeStore(data)
    report = AdoptionReport(state="verifying")
    job = Adoption(store, KeptArena(None, chunks, report), hold_for=0.0)   # type: ignore[arg-type]

    async def run() -> None:
        job.start(asyncio.get_running_loop())
        await job._task

    asyncio.run(run())
    job.close()
    assert store.calls == [("adopt", [0, 1]), ("adopt", [2]), ("drop", [3]), ("adopt", [4, 5]), ("adopt", [6, 7])]
    assert report.state == "done" and report.verified_chunks == 7 and report.corrupt_chunks == 1
    assert job.waiting == [] and sorted(store.populated) == [n * SIZE for n in range(8)]
