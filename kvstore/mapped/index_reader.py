"""Lookups answered from the index the daemon publishes in shared memory, without a round trip (the reader side).

``SharedIndexView.lookup`` walks the request's keys through the table (layout and lock-free protocol in
``protocol/index_layout.py``) and returns the same answer the daemon's own walk would give — how many leading
keys are stored and in which tier — or None when only the socket can answer correctly:

* the view is stale or gone: the heartbeat is older than ``STALE_S`` (a stuck daemon), the daemon is stopping
  (CLOSED), or the table is being rebuilt (the epoch is odd or moved during the walk). The client also reads
  the view only while its stream connection to the daemon is open (``Client.lookup_tiers``): a daemon that
  died closes it, which one non-blocking read sees (read at most every ``stream_transport.ALIVE_READ_S``), so a
  dead daemon's index stops answering within 10 ms;
* a slot kept changing under the reader, or a key sits past ``MAX_PROBE`` slots (the writer did not list it);
* the lookup must start work in the daemon: a leading chunk only the disk tier holds (the daemon starts its
  promotion at lookup time), or a walk that stops short while a remote tier sits below (the daemon asks it).

What a lookup does to the daemon's bookkeeping besides that — the LRU touch of the found chain, the hit-rate
counters — is sent later as one LOOKUP_SEEN note per batch of lookups (see ``SeenNotes``), so that the eviction
order and the metrics stay what they would have been.

Cost: about a microsecond per key in CPython (two reads of the slot's sequence word and one 32-byte unpack), no
system call; the socket's lookup costs a round trip through both processes and ZeroMQ's I/O threads.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Literal, Sequence

from ..native.walk import STATES, NativeWalk, WalkRead
from ..protocol.index_layout import (
    CLOSED, DISK, EMPTY, FILE_BYTES, H_EPOCH, H_FLAGS, H_HEARTBEAT, H_MAGIC, H_SLOTS, H_VERSION, HEADER_BYTES,
    LAYOUT_VERSION, MAGIC, MAX_PROBE, REMOTE, SLOT_BYTES, STALE_NS, TIER_OF_STATE, supported,
)

_SLOT6 = struct.Struct("<6Q").unpack_from
_RETRIES = 3
_KEY_BYTES = 16


@dataclass(frozen=True)
class Prefix:
    """The listed keys heading a chain, as one walk read them (one item per key in each list)."""

    missed: bool          # the walk stopped at a key that is not listed (False: every key is listed)
    count: int            # the leading keys listed
    counts: list[int]     # how many of them each state (tier) holds, indexed by state
    slot_offsets: list[int]   # these lists: per listed key, when the walk was asked for detail
    seqs: list[int]
    hosts: list[int]      # the arena offset of the DRAM copy plus one (0: none)
    sizes: list[int]


class SharedIndexView:
    """A read-only mapping of one daemon's published index."""

    def __init__(self, path: str, ns_mask: int = 0) -> None:
        """Map ``path`` for a reader whose keys are bound by ``ns_mask`` (its namespace's, ``binding.py``): the
        daemon lists keys bound, and the walk binds each key it reads with."""
        self._ns_mask = ns_mask
        fd = os.open(path, os.O_RDONLY)
        try:
            self._buf = mmap.mmap(fd, FILE_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._words = memoryview(self._buf).cast("Q")
        self._native = NativeWalk.open(self._buf, ns_mask)   # None: the Python walk (the library is not built)
        if self._words[H_MAGIC] != MAGIC or self._words[H_VERSION] != LAYOUT_VERSION:
            self.close()
            raise OSError(f"{path} is not a kvstore lookup index of layout {LAYOUT_VERSION}")
        self.path = path
        self.answered = 0        # lookups answered here
        self.deferred = 0        # lookups handed to the socket

    @classmethod
    def open(cls, path: str | None, ns_mask: int = 0) -> "SharedIndexView | None":
        """The view of ``path`` for a reader of the namespace whose mask is ``ns_mask``, or None when there is none
        to have (no path, unsupported machine, unreadable)."""
        if not path or not supported():
            return None
        try:
            return cls(path, ns_mask)
        except (OSError, ValueError):
            return None

    @property
    def walks_in_c(self) -> bool:
        """Whether walks run in C (False: in Python, because the library is not built or ``walk_in_python``)."""
        return self._native is not None

    def walk_in_python(self) -> None:
        """Walk in Python from now on, as a reader without the C library does (to compare the two walks)."""
        if self._native is not None:
            self._native.close()
            self._native = None

    def bare_walk(self, packed: bytes) -> int:
        """How many leading keys of ``packed`` (end to end) one walk finds listed, with no check of the header, no
        retry and no count: the floor a benchmark holds a lookup to. 0 when the table moved under it."""
        read = (self._native or self).walk(packed, len(packed) // _KEY_BYTES, self._words[H_SLOTS] - 1, False)
        return read[1] if isinstance(read, tuple) else 0

    def lookup(self, keys: Sequence[bytes], promote: bool) -> tuple[int, dict[str, int]] | None:
        """(leading keys stored, count per tier), or None: ask the socket (see the module docstring)."""
        packed = packed_keys(keys)
        if packed is None:
            self.deferred += 1
            return None
        answer = self.answer(packed, promote)
        return None if answer is None else (answer[0], tiers_of(answer[1]))

    def answer(self, packed: bytes, promote: bool) -> tuple[int, list[int], bytes] | None:
        """``lookup``'s answer for the keys ``packed`` end to end, with the count per state as the walk read it
        (``tiers_of`` names them) and the found keys packed (``SeenNotes.add_packed`` tells the daemon of them):
        what a client's ``lookup`` takes. The keys are packed once (by the client) for all tries and the note."""
        answer = self._tries(packed, len(packed) // _KEY_BYTES, promote)
        if answer is None:
            self.deferred += 1
            return None
        self.answered += 1
        count, counts = answer
        return count, counts, packed[:_KEY_BYTES * count]

    def _tries(self, packed: bytes, n: int, promote: bool) -> tuple[int, list[int]] | None:
        """Up to ``_RETRIES`` walks while the table moves under them: the answer, or None (ask the socket)."""
        for _ in range(_RETRIES):
            answer = self.try_lookup(packed, n, promote)
            if answer is not False:
                return answer
        return None

    def _header(self) -> tuple[int, int, int] | Literal[False] | None:
        """A walk's start: (epoch, flags, slot mask); None when the view cannot answer (stale, stopping); False
        while the table is rebuilt."""
        w = self._words
        epoch = w[H_EPOCH]
        flags = w[H_FLAGS]
        if epoch & 1:
            return False
        if flags & CLOSED or time.monotonic_ns() - w[H_HEARTBEAT] > STALE_NS:
            return None
        return epoch, flags, w[H_SLOTS] - 1

    def _read(self, packed: bytes, n: int, detail: bool) -> tuple[int, int, WalkRead] | Literal[False] | None:
        """One try at the listed keys heading the ``n`` keys in ``packed``: (epoch, flags, what the walk read, with
        each key's slot when ``detail``); None or False as ``_header`` and the walk say."""
        header = self._header()
        if not isinstance(header, tuple):
            return header
        epoch, flags, mask = header
        read = (self._native or self).walk(packed, n, mask, detail)
        if not isinstance(read, tuple):
            return read
        return (epoch, flags, read) if self._words[H_EPOCH] == epoch else False

    def walk(self, packed: bytes, n: int, mask: int, detail: bool = True) -> WalkRead | Literal[False] | None:
        """The walk a key at a time, in Python (``kvstore/native/walk.py`` has it in C): as ``NativeWalk.walk``
        (which leaves the per-key lists empty without ``detail``; here they cost nothing extra)."""
        words = struct.unpack(f"<{2 * n}Q", packed)
        w, buf = self._words, self._buf
        offsets: list[int] = []
        seqs: list[int] = []
        counts = [0] * STATES
        hosts: list[int] = []
        sizes: list[int] = []
        ns_mask = self._ns_mask
        for j in range(0, len(words), 2):
            lo, hi = words[j] ^ ns_mask, words[j + 1]
            slot = lo & mask
            for _ in range(MAX_PROBE):
                off = HEADER_BYTES + slot * SLOT_BYTES
                seq, klo, khi, state, host, size = _SLOT6(buf, off)
                if seq & 1 or seq != w[off >> 3]:
                    return False        # the writer is in this slot: start over
                if klo == lo and khi == hi and state >= DISK:
                    offsets.append(off)
                    seqs.append(seq)
                    counts[state] += 1
                    hosts.append(host)
                    sizes.append(size)
                    break
                if state == EMPTY:
                    return True, len(seqs), counts, offsets, seqs, hosts, sizes   # a miss: the walk ends here
                slot = (slot + 1) & mask
            else:
                return None             # not listed within MAX_PROBE slots
        return False, len(seqs), counts, offsets, seqs, hosts, sizes

    def lists_all(self, packed: bytes) -> bool:
        """Whether one try finds every key in ``packed`` (end to end) listed; a table that moved under the try
        counts as "no". Counts no lookup (``answer`` does)."""
        n = len(packed) // _KEY_BYTES
        walk = self.try_lookup(packed, n, False)
        return isinstance(walk, tuple) and walk[0] == n

    def try_lookup(self, packed: bytes, n: int, promote: bool) -> tuple[int, list[int]] | Literal[False] | None:
        """One try for the ``n`` keys in ``packed``, uncounted.

        Args:
            packed: the keys end to end.
            n: how many keys ``packed`` holds.
            promote: the lookup asks for promotions, so a disk copy (or a miss with a remote tier) needs the socket.

        Returns:
            (leading keys listed, count per state), None (the socket must answer), or False (the table moved:
            try again).
        """
        if self._native is not None:   # the same try in one C call
            return self._native.lookup(packed, n, promote)
        read = self._read(packed, n, detail=False)
        if not isinstance(read, tuple):
            return read
        _, flags, (missed, count, counts, *_) = read
        if promote and (counts[DISK] or (missed and flags & REMOTE)):
            return None
        return count, counts

    def locate(self, packed: bytes) -> tuple[int, list[tuple[int, int, int, int]]] | Literal[False] | None:
        """Where the leading keys' (``packed`` end to end) DRAM copies are, for a reader copying them out of the arena:
        (epoch, one ``(slot offset, seq, arena offset, size)`` per chunk of the prefix held in DRAM); None when only the
        socket can answer (the view is stale, or the prefix stops at a chunk held elsewhere, not listed, or — with a
        remote tier below — missing); False when the table moved (try again). Check the copies with ``unchanged``
        afterwards."""
        read = self._read(packed, len(packed) // _KEY_BYTES, detail=True)
        if not isinstance(read, tuple):
            return read
        epoch, flags, walked = read
        prefix = Prefix(*walked)
        if 0 in prefix.hosts:
            return None                 # held on disk or in the GPU tier only: the daemon fetches it
        if prefix.missed and flags & REMOTE:
            return None                 # the remote store may hold it
        return epoch, [(off, seq, host - 1, size) for off, seq, host, size
                       in zip(prefix.slot_offsets, prefix.seqs, prefix.hosts, prefix.sizes)]

    def unchanged(self, epoch: int, located: Sequence[tuple[int, int, int, int]]) -> int:
        """How many leading chunks of ``locate``'s answer still sit where it said (slot and table untouched since):
        the bytes copied from those are the chunks'."""
        w = self._words
        if w[H_EPOCH] != epoch:
            return 0
        for i, (off, seq, _, _) in enumerate(located):
            if w[off >> 3] != seq:
                return i
        return len(located) if w[H_EPOCH] == epoch else 0

    def stale(self) -> bool:
        """Whether the writer looks gone (no heartbeat for STALE_S) or stopping."""
        w = self._words
        return bool(w[H_FLAGS] & CLOSED) or time.monotonic_ns() - w[H_HEARTBEAT] > STALE_NS

    def close(self) -> None:
        native = getattr(self, "_native", None)   # absent when the constructor failed
        if native is not None:
            native.close()
        self._words.release()
        self._buf.close()


def packed_keys(keys: Sequence[bytes]) -> bytes | None:
    """The keys end to end, or None when one is not of 16 bytes (the socket names the bad one)."""
    packed = b"".join(keys)
    if len(packed) != _KEY_BYTES * len(keys) or (keys and max(map(len, keys)) != _KEY_BYTES):
        return None
    return packed


def tiers_of(counts: Sequence[int]) -> dict[str, int]:
    """A walk's count per state, by tier name (the tiers holding none left out), as the daemon's lookup says."""
    return {name: counts[state] for state, name in TIER_OF_STATE.items() if counts[state]}


class SeenNotes:
    """Lookups answered from the shared index, batched into LOOKUP_SEEN notes for the daemon.

    A note carries, per lookup, how many keys were asked and the found chain (packed keys): the daemon touches
    that chain in its eviction order and counts the lookup, as its own lookup would have; and per get the client
    copied out of the arena itself (``client/arena_read.py``), the chain read, touched and counted as a get.
    Lookups of a batch that asked the same and found the same are told once, with how many they were
    (``repeat``), at the place of the last of them: the daemon's queues end the same as after each in turn (an
    LRU's order depends only on each chain's last touch; S3-FIFO counts touches, which the daemon repeats up to its
    cap) and its counters count every one. A scheduler asking about a request every pass it waits would otherwise
    have the daemon touch the same chain hundreds of times a second for each engine.
    Notes are sent without waiting for a reply, at most every ``interval`` seconds or ``max_keys`` keys (the first
    one at once), and always before any other request of the client, so a request that follows a lookup (a get, a
    stats call) sees its effect; lookups made less than ``interval`` after a note wait for the client's next one.
    """

    # 250 ms: on a loaded host a reply-less send costs the sender a preemption by the woken daemon, and the call
    # that finds the note due pays it. The more often notes go, the larger the share of a scheduler's lookups that
    # pay it, which becomes their tail latency, and with several schedulers the daemon wakes for notes more often
    # than for requests (``bench/client_throughput.py`` measures the tail under such schedulers). A touch of the
    # eviction order 250 ms late changes little, and what watches the daemon (stats, Prometheus) reads it once a
    # second or less often.
    def __init__(self, interval: float = 0.25, max_keys: int = 2048) -> None:
        self.interval = interval
        self.max_keys = max_keys
        self.lookups: dict[tuple[int, bytes], int] = {}   # (asked, found chain packed) -> lookups, last one last
        self.read: list[bytes] = []
        self._keys = 0
        self._since = -math.inf   # the first note goes at once: a client that looks up once and idles is seen

    def add(self, asked: int, found: Sequence[bytes]) -> bool:
        """Record one lookup; True when the batch is due to be sent."""
        return self.add_packed(asked, b"".join(found))

    def add_packed(self, asked: int, found: bytes) -> bool:
        """``add`` with the found keys packed end to end (as ``SharedIndexView.answer`` gives them)."""
        seen = (asked, found)
        times = self.lookups.pop(seen, 0)
        self.lookups[seen] = times + 1   # moved to the end: told where the last such lookup was
        if not times:
            self._keys += len(found) // _KEY_BYTES
        return self._keys >= self.max_keys or time.monotonic() - self._since >= self.interval

    def add_read(self, chain: bytes) -> bool:
        """Record one get served from the arena (the chain read, its keys packed end to end); True when the batch
        is due to be sent."""
        self.read.append(chain)
        self._keys += len(chain) // _KEY_BYTES
        return self._keys >= self.max_keys or time.monotonic() - self._since >= self.interval

    def take(self) -> dict | None:
        """The note to send (and an empty batch), or None when there is nothing to tell."""
        self._since = time.monotonic()
        if not self.lookups and not self.read:
            return None
        lookups, repeat = list(self.lookups), list(self.lookups.values())
        note = {"asked": [asked for asked, _ in lookups], "found": [found for _, found in lookups],
                **({"repeat": repeat} if any(n > 1 for n in repeat) else {}),
                **({"read": self.read} if self.read else {})}
        self.lookups, self.read, self._keys = {}, [], 0
        return note

    def __bool__(self) -> bool:
        return bool(self.lookups or self.read)
