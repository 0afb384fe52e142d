"""What a full host tier says: which of the holders keeps the room a chunk needs, in bytes.

A put finds the host tier full only once every chunk that may leave DRAM has left (``room.make_room``), so
what is left is held: by this put itself (a put larger than the whole tier can never fit), by leases, by soft
pins (``retention.py``), by open
reservations (this writer's or others'), by chunks whose slot a lower tier's I/O or a check reads, by put credits
lent to writers, or it is free but in pieces smaller than the chunk — or ``/dev/shm`` could not back the pages
of the room found (``mapped/arena.py``). The message names each with its bytes and
says what would help, most of all the largest holder's fix. Counting walks the index: only a failed allocation
pays for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..mapped.arena import SHM_DIR, shm_free
from ..units import format_size
from .entry import Entry, State


@dataclass
class HostHolders:
    """Bytes of the host tier by what holds them, when a chunk found no room."""

    leased: int = 0
    pinned: int = 0            # soft pins (retention class pin) whose TTL has not ended
    pins_end_in: float | None = None   # seconds until the soonest pin ends
    this_put: int = 0          # what the failing request reserved before the chunk that found no room
    reserved_own: int = 0      # the asking writer's other open reservations
    reserved_others: int = 0
    busy: int = 0              # read by a lower tier's I/O (written to disk, copied up or down) or a check
    credits_own: int = 0
    credits_others: int = 0
    free: int = 0
    unbacked: bool = False     # the last try found room the file system could not back with pages
    backed: int = 0            # bytes of the arena backed by pages


def count_holders(store: Any, owner: bytes | None, taken: Sequence[Entry],
                  may_leave: Callable[[Entry], bool]) -> HostHolders:
    """How the host tier's bytes are held; ``taken``: what the failing request reserved before it failed."""
    host = store.host
    this_put = {id(e) for e in taken}
    mine = {id(e) for h in store.puts.reservations if h.owner == owner for e in h.payload.entries}
    held = HostHolders(free=host.capacity_bytes - host.used_bytes, unbacked=host.last_backing_refused,
                       backed=host.reserved_bytes, pins_end_in=store.retention.soft_pins.soonest())
    for entry in store.index.values():
        if entry.host_offset is None:
            continue
        size = host.allocator.size_of(entry.host_offset)
        if entry.state is State.RESERVED:
            if id(entry) in this_put:
                held.this_put += size
            elif id(entry) in mine:
                held.reserved_own += size
            else:
                held.reserved_others += size
        elif entry.pins:
            held.leased += size
        elif entry.pin_until:
            held.pinned += size
        elif not may_leave(entry):
            held.busy += size
    for handle in store.credits.table:
        if handle.owner == owner:
            held.credits_own += handle.payload.size
        else:
            held.credits_others += handle.payload.size
    return held


def never_fits_message(asked: int, chunks: int, capacity: int) -> str:
    """One line: a put of ``chunks`` new chunks, ``asked`` bytes in all, can never fit a ``capacity``-byte tier."""
    return (f"host tier is too small for this put: it asks for {asked} bytes ({format_size(asked)}) in "
            f"{_new_chunks(chunks)}, and the whole host tier holds {capacity} bytes ({format_size(capacity)}); "
            f"nothing was evicted for it. Put the chunks in smaller batches, or start the daemon with a larger "
            f"--host-mem")


def over_ceiling_message(tenant: str, asked: int, chunks: int, ceiling: int) -> str:
    """One line: a put of ``asked`` bytes can never fit under its tenant's DRAM ceiling of ``ceiling`` bytes."""
    return (f"tenant {tenant} cannot take this put: it asks for {asked} bytes ({format_size(asked)}) in "
            f"{_new_chunks(chunks)}, more than the tenant's whole dram ceiling ({ceiling} bytes, "
            f"{format_size(ceiling)}); nothing was evicted for it. Put the chunks in smaller batches, or raise the "
            f"tenant's dram ceiling")


def _new_chunks(n: int) -> str:
    return f"{n} new chunk" if n == 1 else f"{n} new chunks"


def host_full_message(capacity: int, size: int, held: HostHolders) -> str:
    """One line: why a ``size``-byte chunk found no room, with the bytes of each holder and what would help."""
    if held.unbacked:
        return (f"host tier is full: {SHM_DIR} has no room to back more of the arena ({held.backed} of {capacity} "
                f"bytes backed, {shm_free()} bytes free in {SHM_DIR}); free space there or lower --host-mem")
    if held.this_put + size > capacity:
        return (f"host tier is full: this put needs at least {held.this_put + size} bytes, more than the whole host "
                f"tier ({capacity} bytes); put fewer or smaller chunks at a time, or raise --host-mem")
    parts = [(held.this_put, "taken by this put's earlier chunks", "put fewer chunks at a time"),
             (held.leased, "held by leases", "release leases sooner (or lower --lease-ttl)"),
             (held.pinned, "held by soft pins (retention pin)",
              f"retry once the pins end (the first in {held.pins_end_in or 0:.0f}s, none past --max-pin-ttl), "
              f"or pin less (--max-pin-share, a tenant's max_pin_bytes)"),
             (held.reserved_own, "by this writer's open reservations",
              "commit or abort this client's open reservations before reserving more"),
             (held.reserved_others, "by other writers' open reservations", "retry once the other writers commit"),
             (held.busy, "by chunks being written to a lower tier or checked", "retry once the writes are done"),
             (held.credits_own + held.credits_others, "lent as put credits",
              "retry: credits come back as puts use them"),
             (held.free, "free but in pieces smaller than the chunk", "store smaller chunks")]
    named = ", ".join(f"{nbytes} {what}" for nbytes, what, _ in parts if nbytes)
    fix = max(parts[1:], key=lambda p: p[0])[2] if any(p[0] for p in parts[1:]) else parts[0][2]
    return f"host tier is full: no room for a {size}-byte chunk; of {capacity} bytes, {named}; {fix}"
