"""The byte layout of the lookup index the daemon publishes in shared memory (one writer, many readers).

A lookup answered over the socket costs a round trip through two processes and ZeroMQ's I/O threads (tens to
hundreds of microseconds on a busy host); a client that maps this file answers it by reading memory. The daemon
(``mapped/index_writer.py``) is the only writer; clients (``mapped/index_reader.py``) map it read-only.

File: a 4 KiB header, then ``MAX_SLOTS`` slots of 64 bytes (a cache line each), of which the first ``slots`` (a
power of two, in the header) are the table. The file is sparse: tmpfs backs only the pages the table has touched,
so growing the table never moves the file and a client maps it once.

Header (little-endian u64 fields)::

    0 magic   8 layout version   16 slots   24 epoch   32 heartbeat (CLOCK_MONOTONIC ns)   40 flags   48 writer pid

Slot: ``seq, key_lo, key_hi, state, host, size`` and two spare words (u64 each); ``key_lo``/``key_hi`` are the
two little-endian halves of the key as the daemon keeps it, bound to its namespace (``kvstore/binding.py``: a
reader XORs the low half of each key it looks for with its namespace's mask), ``host`` is the byte offset of the
chunk's DRAM copy in the arena plus one (0: none) and ``size`` its length, so that a local reader can copy a
chunk straight out of the arena (``client/arena_read.py``).
Open addressing with linear probing from ``key_lo & (slots - 1)`` (keys are xxh3-128 outputs: uniform), at most
``MAX_PROBE`` slots. A removed key leaves a TOMBSTONE so that probe chains past it stay intact; a tombstone whose
next slot is EMPTY becomes EMPTY again (no chain runs through it), which keeps tombstones from piling up.

Consistency, without locks:

* Each slot is a sequence lock: the writer makes ``seq`` odd, writes the slot, makes ``seq`` even again. A reader
  reads ``seq``, the slot, then ``seq`` again, and retries a slot whose two reads differ or are odd.
* ``epoch`` is the same lock for the table as a whole: it is odd while the table is rebuilt (grown, or cleared of
  tombstones) and moves on each rebuild, so a reader that saw it change retries or asks the socket.
* A key the writer could not place within ``MAX_PROBE`` slots is simply not listed. Slots only ever turn EMPTY
  where no chain runs through them, so a reader looking for such a key walks ``MAX_PROBE`` non-empty slots, finds
  neither the key nor an EMPTY one, and asks the socket: a miss read from the table is always a real miss.
* The slot's ``seq`` is also the chunk's generation for a reader copying out of the arena: every change of a
  listed chunk's DRAM copy (it is freed, moved, or its key stored anew) rewrites the slot, in the same event-loop
  step as the change and so before the space can be handed to any writer. A reader that reads ``seq`` (even), the
  offset, copies the bytes, then finds ``seq`` and ``epoch`` unchanged copied the chunk the slot named; otherwise
  it throws the copy away.
* ``heartbeat`` is rewritten by the daemon's sweep; a reader treats a view older than ``STALE_S`` (a crashed or
  stuck daemon) as absent. ``CLOSED`` is set when the daemon stops taking new work.

The reader relies on loads not being reordered with other loads and stores not with other stores (x86-64's
memory model): the writer is Python and cannot issue fences. Elsewhere the index is not offered and every lookup
takes the socket.
"""

from __future__ import annotations

import platform
import struct

MAGIC = int.from_bytes(b"KVSINDX1", "little")
LAYOUT_VERSION = 3          # 2: slots carry the DRAM copy's offset and size; 3: keys are bound (binding.py)
HEADER_BYTES = 4096
SLOT_BYTES = 64
SLOT_WORDS = SLOT_BYTES // 8
MIN_SLOTS = 1 << 12
MAX_SLOTS = 1 << 22          # 4 Mi chunks listed; 256 MiB of table at most (the file is sparse below that)
MAX_PROBE = 32
STALE_S = 1.0                # a heartbeat older than this: the writer is gone or stuck
STALE_NS = int(STALE_S * 1e9)

# header word offsets (in u64 words)
H_MAGIC, H_VERSION, H_SLOTS, H_EPOCH, H_HEARTBEAT, H_FLAGS, H_PID = range(7)
HEADER_FORMAT = struct.Struct("<7Q")

# flags
CLOSED = 1        # the daemon is stopping: new work (lookups included) goes to the socket, which refuses it
REMOTE = 2        # a remote tier sits below: a lookup that stops short must ask the socket (it asks the store)

# slot states; a listed key's state is its fastest tier
EMPTY, TOMBSTONE, DISK, HOST, GPU = range(5)
TIER_OF_STATE = {DISK: "disk", HOST: "host", GPU: "gpu"}
STATE_OF_TIER = {name: state for state, name in TIER_OF_STATE.items()}

FILE_BYTES = HEADER_BYTES + MAX_SLOTS * SLOT_BYTES


def supported() -> bool:
    """Whether this machine's memory model makes the lock-free reads above sound (see the module docstring)."""
    return platform.machine().lower() in ("x86_64", "amd64")
