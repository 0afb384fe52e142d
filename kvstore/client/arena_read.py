"""Gets without a round trip: a local client copies chunks straight out of the arena (``Client.get_into``).

A leased get costs a round trip (the lease) and a message (its release) around the caller's copy; for chunks of
a few hundred KiB that round trip costs as much as the copy. A reader that copies anyway (an engine filling its
KV cache) can instead find the chunks through the daemon's published index, which lists each chunk's DRAM
offset and size (``protocol/index_layout.py``), copy them out with no pin, and then check that nothing changed
under the copy: a seqlock read. The slot's ``seq`` is the chunk's generation — the daemon rewrites the slot in
the same event-loop step as it frees, moves or replaces the chunk's DRAM copy, before the space can be lent to
any writer — so when every slot's ``seq`` and the table's ``epoch`` read after the copy are those read before
it, each copy is of the chunk the slot named, whole (it was listed, so committed, before the copy began).
When something changed the read is tried again, then handed to the socket (a leased get), as is any prefix the
index cannot answer alone (a chunk held only on disk or in the GPU tier, a remote tier below, a stale view).

What stays the same: only listed (committed) chunks are read; a slot reused meanwhile fails the check, so its new
bytes are never taken for the old chunk; a reader that verifies (``verify=True``) takes the leased path, which
carries each chunk's checksum. The daemon still sees the get: it is batched into the next LOOKUP_SEEN note
(touched in the eviction order, counted as a get), like lookups answered from the index.

Cost: the index walk (one C call where the library is built) and one read of each slot's ``seq`` after the
copies; no system call but the liveness check of the stream (one non-blocking read), and the page-table
population of untouched granules (``pages.py``). A chunk evicted during the copy costs the copy again.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import UsageError
from .buffers import copy_out, nbytes_of
from .copies import copy_batch
from .pages import PagePopulator
from ..mapped.index_reader import SharedIndexView

TRIES = 2   # a read that changed under the copy twice goes to the socket


def read_with(index: SharedIndexView, arena: memoryview, pages: PagePopulator | None, packed: bytes,
              copy: Callable[[list[memoryview]], None]) -> int | None:
    """Hand ``copy`` views of the arena (its read-only mapping) holding the longest stored prefix of the keys
    ``packed`` end to end, checked unchanged after it returns; how many chunks it was given, or None: ask the
    socket. ``copy`` may be called again (the chunks changed under it, or the prefix got shorter) and must then
    redo its copy from the views it is given."""
    for _ in range(TRIES):
        located = index.locate(packed)
        if located is None:
            return None
        if located is False:
            continue
        epoch, found = located
        if any(offset + size > len(arena) for _, _, offset, size in found):
            return None   # not a slot of the arena this client maps
        if pages is not None:
            pages.touch_many([(offset, size) for _, _, offset, size in found])
        copy([arena[offset:offset + size] for _, _, offset, size in found])
        if index.unchanged(epoch, found) == len(found):
            return len(found)
    return None


def read_into(index: SharedIndexView, arena: memoryview, pages: PagePopulator | None, packed: bytes,
              outs: Sequence[Any]) -> int | None:
    """Copy the longest stored prefix of the keys ``packed`` end to end into ``outs`` (``writable_bytes`` of the
    caller's destinations); how many chunks were copied, or None: ask the socket (``outs`` may then hold partial
    copies)."""

    def into(views: list[memoryview]) -> None:
        sizes = [view.nbytes for view in views]
        for i, (size, out) in enumerate(zip(sizes, outs)):
            room = out.nbytes if type(out) is memoryview else nbytes_of(out)
            if room < size:
                raise UsageError(f"get_into: destination {i} holds {room} bytes; its chunk has {size}")
        copy_batch(copy_out, list(zip(outs, views)), sizes)

    return read_with(index, arena, pages, packed, into)
