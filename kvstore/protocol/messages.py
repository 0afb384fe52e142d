"""Typed arguments of each request after hello, validated from an untrusted header.

Every field is read through ``fields.py``'s readers, which check type, length and range and raise
BadRequestError or LimitError naming the field; handlers receive these dataclasses, never raw dicts. HELLO's
own message is ``hello.py``. A client's checks of what it is about to send (``check_batch``) live here too.

May call the field readers (``fields.py``), the other messages' parts (``hello.py``'s bounds, ``engine_blocks.py``,
``retention.py``) and the leaves they call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import math

from ..errors import BadRequestError, LimitError
from ..keys import KEY_BYTES
from .engine_blocks import EngineBlocks, read_engine
from .fields import (read_bool, read_float, read_int, read_keys, read_optional_key, read_sizes, read_str,
                     unpack_keys)
from .hello import MAX_NAMESPACE_CHARS
from .retention import NORMAL, RetentionAsk, read_retention
from .wire import MAX_BATCH


def check_batch(keys: Any, what: str) -> None:
    """A client's check before anything is copied or sent: more keys than one request may carry is the
    LimitError the daemon would answer (a request too large for its frame would not even reach it whole)."""
    count = len(keys) if hasattr(keys, "__len__") else 0
    if count > MAX_BATCH:
        raise LimitError(f"{what}: {count} keys in one call; the limit per request is {MAX_BATCH} "
                         f"(split them into calls of at most {MAX_BATCH})")


@dataclass(frozen=True)
class Lookup:
    keys: list[bytes]
    promote: bool

    @classmethod
    def parse(cls, h: dict[str, Any]) -> "Lookup":
        return cls(keys=read_keys(h, allow_empty=True), promote=read_bool(h, "promote", True))


@dataclass(frozen=True)
class Reserve:
    keys: list[bytes]
    sizes: list[int]
    parent: bytes | None
    credit: int = 0     # a put credit the writer offers to free should the room be short (0: none)
    engine: list[EngineBlocks | None] | None = None   # the engine's names of each chunk's blocks, if sent
    retention: RetentionAsk = NORMAL   # the class the chunks are kept in (``protocol/retention.py``)

    @classmethod
    def parse(cls, h: dict[str, Any], max_size: int) -> "Reserve":
        keys = read_keys(h)
        if len(set(keys)) != len(keys):
            raise BadRequestError("field 'keys' holds the same key twice")
        return cls(keys=keys, sizes=read_sizes(h, len(keys), max_size), parent=read_optional_key(h, "parent"),
                   credit=read_int(h, "credit", 0, (1 << 64) - 1, default=0), engine=read_engine(h, len(keys)),
                   retention=read_retention(h))


@dataclass(frozen=True)
class PutInline:
    """A put with its bytes in the message: one payload frame per key, in order. A put asking for no storage
    (``retention`` that stores nothing) is read as its keys alone: its frames, if sent, are dropped."""

    keys: list[bytes]
    sizes: list[int]          # each payload frame's bytes
    parent: bytes | None
    engine: list[EngineBlocks | None] | None = None
    retention: RetentionAsk = NORMAL

    @classmethod
    def parse(cls, h: dict[str, Any], frames: Sequence[Any], max_size: int) -> "PutInline":
        keys = read_keys(h)
        retention = read_retention(h)
        if not retention.stores:
            return cls(keys=keys, sizes=[], parent=None, retention=retention)
        if len(frames) != len(keys):
            raise BadRequestError(f"PUT_INLINE carries {len(frames)} payload frames for {len(keys)} keys")
        if len(set(keys)) != len(keys):
            raise BadRequestError("field 'keys' holds the same key twice")
        sizes = [len(f) for f in frames]
        for i, size in enumerate(sizes):
            if size == 0:
                raise BadRequestError(f"payload frame {i} is empty")
            if size > max_size:
                raise LimitError(f"payload frame {i} is {size} bytes; the largest chunk accepted is {max_size}")
        return cls(keys=keys, sizes=sizes, parent=read_optional_key(h, "parent"), engine=read_engine(h, len(keys)),
                   retention=retention)


MAX_CREDIT_BYTES = 1 << 48


@dataclass(frozen=True)
class CreditPut:
    """Chunks a writer copied into its credit (``store/credits.py``), and the credit it wants for the next put."""

    credit: int              # 0: none held (a first credit is asked for; no keys then)
    keys: list[bytes]
    offsets: list[int]       # arena byte offsets, checked against the credit by the Store
    sizes: list[int]
    parent: bytes | None
    want: int                # bytes the writer wants lent for its next put (0: give the credit back)
    engine: list[EngineBlocks | None] | None = None   # the engine's names of each chunk's blocks, if sent
    retention: RetentionAsk = NORMAL

    @classmethod
    def parse(cls, h: dict[str, Any], max_size: int) -> "CreditPut":
        keys = read_keys(h, allow_empty=True)
        if len(set(keys)) != len(keys):
            raise BadRequestError("field 'keys' holds the same key twice")
        return cls(credit=read_int(h, "credit", 0, (1 << 64) - 1), keys=keys,
                   offsets=read_offsets(h, len(keys)), sizes=read_sizes(h, len(keys), max_size) if keys else [],
                   parent=read_optional_key(h, "parent"), want=read_int(h, "want", 0, MAX_CREDIT_BYTES),
                   engine=read_engine(h, len(keys)) if keys else None, retention=read_retention(h))


def read_offsets(h: dict[str, Any], count: int) -> list[int]:
    value = h.get("offsets", [] if not count else None)
    if not isinstance(value, list) or len(value) != count:
        raise BadRequestError(f"field 'offsets' must be a list of {count} integers, one per key")
    for i, o in enumerate(value):
        if not isinstance(o, int) or isinstance(o, bool) or not 0 <= o < MAX_CREDIT_BYTES:
            raise BadRequestError(f"offsets[{i}] must be an integer in [0, {MAX_CREDIT_BYTES}), got {o!r}")
    return value


@dataclass(frozen=True)
class Handle:
    """A lease or reservation id."""

    handle: int

    @classmethod
    def parse(cls, h: dict[str, Any], name: str) -> "Handle":
        return cls(handle=read_int(h, name, 0, (1 << 64) - 1))


@dataclass(frozen=True)
class Get:
    keys: list[bytes]
    inline: bool
    wait_ms: int
    gpu: bool      # the caller maps the GPU pool: GPU-tier chunks may be handed out as GPU slots
    verify: bool   # the caller checks what it reads: the reply carries each chunk's checksum

    @classmethod
    def parse(cls, h: dict[str, Any]) -> "Get":
        return cls(keys=read_keys(h), inline=read_bool(h, "inline", False),
                   wait_ms=read_int(h, "wait_ms", 0, 60_000, default=2_000), gpu=read_bool(h, "gpu", False),
                   verify=read_bool(h, "verify", False))


@dataclass(frozen=True)
class Keys:
    keys: list[bytes]

    @classmethod
    def parse(cls, h: dict[str, Any]) -> "Keys":
        return cls(keys=read_keys(h))


MAX_SCRUB_RATE = 1 << 50   # bytes per second; 0 is "as fast as it goes"


@dataclass(frozen=True)
class Scrub:
    rate: int      # bytes checked per second at most (0: no bound)

    @classmethod
    def parse(cls, h: dict[str, Any]) -> "Scrub":
        return cls(rate=read_int(h, "rate", 0, MAX_SCRUB_RATE, default=0))


MAX_INVALIDATE_NAMES = 1024   # namespaces (or prefixes) one INVALIDATE names at most


@dataclass(frozen=True)
class Invalidate:
    names: list[str]    # namespaces, or with ``prefix`` the starts of namespaces, whose chunks are dropped
    prefix: bool        # each name is a prefix: every namespace that starts with it (not empty)

    @classmethod
    def parse(cls, h: dict[str, Any]) -> "Invalidate":
        names = h.get("namespaces")
        if not isinstance(names, list) or not names:
            raise BadRequestError("field 'namespaces' must be a non-empty list of namespace names")
        if len(names) > MAX_INVALIDATE_NAMES:
            raise LimitError(f"field 'namespaces' names {len(names)}; the limit is {MAX_INVALIDATE_NAMES}")
        prefix = read_bool(h, "prefix", False)
        for i, name in enumerate(names):
            read_str({"name": name}, "name", MAX_NAMESPACE_CHARS)
            if prefix and not name:
                raise BadRequestError(f"namespaces[{i}] is an empty prefix, which would name every namespace; "
                                      f"name the namespaces (or their prefixes) to drop")
        return cls(names=list(names), prefix=prefix)


MAX_KEEPALIVE_MS = 3_600_000   # a client may go quiet for an hour at most before its pass is stopped


@dataclass(frozen=True)
class ScrubStart:
    rate: int           # bytes checked per second at most (0: no bound)
    keepalive: float    # seconds without a SCRUB_STATUS after which the pass is stopped

    @classmethod
    def parse(cls, h: dict[str, Any]) -> "ScrubStart":
        return cls(rate=read_int(h, "rate", 0, MAX_SCRUB_RATE, default=0),
                   keepalive=read_int(h, "keepalive_ms", 100, MAX_KEEPALIVE_MS, default=10_000) / 1000)


@dataclass(frozen=True)
class ScrubPassId:
    pass_id: int        # as SCRUB_START answered; 0 in SCRUB_CANCEL: every pass clients started

    @classmethod
    def parse(cls, h: dict[str, Any]) -> "ScrubPassId":
        return cls(pass_id=read_int(h, "pass", 0, 1 << 62))


@dataclass(frozen=True)
class VerifyReport:
    """A connector computed the KV of ``keys``' chunks and compared it with the stored chunks."""

    namespace: str
    keys: list[bytes]        # the chunks compared, in chain order
    checks: int              # chunks compared
    mismatches: int          # chunks that differed beyond the connector's tolerance
    max_difference: float    # largest absolute difference seen (inf for non-finite values)
    first_bad: int | None    # index in ``keys`` of the first chunk that differed (None: none did)

    @classmethod
    def parse(cls, h: dict[str, Any]) -> "VerifyReport":
        keys = read_keys(h)
        checks = read_int(h, "checks", 0, len(keys))
        mismatches = read_int(h, "mismatches", 0, checks)
        first_bad = h.get("first_bad")
        if first_bad is not None:
            first_bad = read_int(h, "first_bad", 0, len(keys) - 1)
        if mismatches and first_bad is None:
            raise BadRequestError("field 'first_bad' must name the first mismatching chunk when mismatches > 0")
        return cls(namespace=read_str(h, "namespace", MAX_NAMESPACE_CHARS), keys=keys, checks=checks,
                   mismatches=mismatches, max_difference=read_float(h, "max_difference", 0.0, math.inf),
                   first_bad=first_bad if mismatches else None)


MAX_SEEN_LOOKUPS = 4096
MAX_SEEN_REPEAT = 1 << 20   # lookups one entry of a note may stand for


@dataclass(frozen=True)
class LookupSeen:
    """Lookups a client answered from the shared index: per lookup, keys asked and the found chain (``repeat``:
    how many lookups of the batch asked the same and found the same, 1 each when absent); and the gets it served
    itself from the arena (``read``: per get, the chain copied)."""

    asked: list[int]
    found: list[list[bytes]]
    read: list[list[bytes]] = field(default_factory=list)
    repeat: list[int] = field(default_factory=list)

    @classmethod
    def parse(cls, h: dict[str, Any]) -> "LookupSeen":
        asked, found = h.get("asked"), h.get("found")
        if not isinstance(asked, list) or not isinstance(found, list) or len(asked) != len(found):
            raise BadRequestError("fields 'asked' and 'found' must be lists of the same length, one per lookup")
        if len(asked) > MAX_SEEN_LOOKUPS:
            raise LimitError(f"a LOOKUP_SEEN note holds {len(asked)} lookups; the limit is {MAX_SEEN_LOOKUPS}")
        chains = []
        for i, (n, packed) in enumerate(zip(asked, found)):
            if not isinstance(packed, bytes):
                raise BadRequestError(f"found[{i}] must be packed {KEY_BYTES}-byte keys")
            chain = unpack_keys(packed, f"found[{i}]", allow_empty=True)
            if not isinstance(n, int) or isinstance(n, bool) or not len(chain) <= n <= MAX_BATCH:
                raise BadRequestError(f"asked[{i}] must be an integer in [{len(chain)}, {MAX_BATCH}]")
            chains.append(chain)
        return cls(asked=asked, found=chains, read=_read_chains(h), repeat=_repeats(h, len(asked)))


def _repeats(h: dict[str, Any], lookups: int) -> list[int]:
    repeat = h.get("repeat")
    if repeat is None:
        return [1] * lookups
    if (not isinstance(repeat, list) or len(repeat) != lookups
            or not all(type(r) is int and 1 <= r <= MAX_SEEN_REPEAT for r in repeat)):
        raise BadRequestError(f"field 'repeat' must list one count in [1, {MAX_SEEN_REPEAT}] per lookup")
    return repeat


def _read_chains(h: dict[str, Any]) -> list[list[bytes]]:
    read = h.get("read", [])
    if not isinstance(read, list) or len(read) > MAX_SEEN_LOOKUPS:
        raise BadRequestError(f"field 'read' must be a list of at most {MAX_SEEN_LOOKUPS} packed key chains")
    for i, packed in enumerate(read):
        if not isinstance(packed, bytes):
            raise BadRequestError(f"read[{i}] must be packed {KEY_BYTES}-byte keys")
    return [unpack_keys(packed, f"read[{i}]", allow_empty=True) for i, packed in enumerate(read)]


LOAD_MEDIA = ("CPU", "GPU")   # the KV cache events' media a client loads from itself (the arena, the GPU pool)
MAX_LOAD_NS = 1 << 62


@dataclass(frozen=True)
class LoadTimes:
    """How long a client's loads took since its last note, per medium: bytes loaded and nanoseconds spent (from
    asking for the chunks to the end of the copy into the engine)."""

    media: list[str]
    nbytes: list[int]
    ns: list[int]

    @classmethod
    def parse(cls, h: dict[str, Any]) -> "LoadTimes":
        media, nbytes, ns = h.get("media"), h.get("bytes"), h.get("ns")
        if (not isinstance(media, list) or not isinstance(nbytes, list) or not isinstance(ns, list)
                or not len(media) == len(nbytes) == len(ns) or len(media) > len(LOAD_MEDIA)):
            raise BadRequestError(f"fields 'media', 'bytes' and 'ns' must be lists of the same length, at most "
                                  f"{len(LOAD_MEDIA)}, one entry per medium")
        for i, medium in enumerate(media):
            if medium not in LOAD_MEDIA:
                raise BadRequestError(f"media[{i}] = {medium!r} is not a medium loaded by clients; use one of "
                                      f"{', '.join(LOAD_MEDIA)}")
        for name, values in (("bytes", nbytes), ("ns", ns)):
            for i, v in enumerate(values):
                if type(v) is not int or not 0 <= v <= MAX_LOAD_NS:
                    raise BadRequestError(f"{name}[{i}] must be an integer in [0, {MAX_LOAD_NS}]")
        return cls(media=media, nbytes=nbytes, ns=ns)
