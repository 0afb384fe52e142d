"""KV cache events on the wire, in vLLM's format: what routers (llm-d, Dynamo, vLLM's own) already decode.

Message (ZeroMQ PUB, multipart): ``[topic, seq, payload]``, ``seq`` an 8-byte big-endian unsigned integer that
grows by one per batch (a batch dropped under back-pressure leaves a gap on purpose), ``payload`` msgpack of an
``EventBatch``: the array ``[ts, events, data_parallel_rank]`` (always three elements; the rank is the engine's
on an engine's own topic, 0 on the daemon-wide one: ``protocol/event_topics.py``).

Two event forms, chosen by ``--events-format``:

* ``map`` (default; vLLM's ``kv_events.py`` from the release whose events became tagged maps on, 0.32 and 0.33
  included): each event a map tagged ``"type"``. ``BlockStored`` always carries ``block_hashes``,
  ``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``, ``medium`` and ``lora_name`` (fields without
  a default there); fields with a default (``extra_keys``, ``group_idx``, ``locality``, ...) are left out, as
  msgspec's ``omit_defaults`` leaves them. ``BlockRemoved``: ``block_hashes``, ``medium``. ``AllBlocksCleared``:
  the tag alone.
* ``array`` (the older positional form, vLLM's ``array_like`` events before the change, as in its
  ``kv_events_subscriber.py`` example of that time): ``["BlockStored", hashes, parent, token_ids, block_size,
  lora_id, medium]``, ``["BlockRemoved", hashes, medium]``, ``["AllBlocksCleared"]``.

Groups: a chunk of an engine that named its KV cache groups at hello (a hybrid model's attention and
recurrent-state groups: ``protocol/engine_identity.py``) is published once per group, as vLLM publishes such a
model's blocks: each ``BlockStored`` with ``group_idx``, ``kv_cache_spec_kind`` and
``kv_cache_spec_sliding_window``, each ``BlockRemoved`` with ``group_idx``. The chunk holds every group, so the
events of its groups always come and go together. The array form predates groups and carries none.

Every event also carries the publisher's incarnation id (16 hex digits, new at every start): the extra key
``kvstore_incarnation`` in map form, one trailing element in array form. vLLM's decoder ignores unknown map keys
and trailing array elements (its structs do not forbid unknown fields), as do Dynamo's and llm-d's.

Replay (ZeroMQ ROUTER): a request ``[b"", start_seq]`` (8 bytes, big-endian) is answered with every buffered
batch of the daemon-wide stream from ``start_seq`` on, each ``[b"", topic, seq, payload]``, then the end marker
``[b"", b"", END_SEQ, b""]``; ``[b"", start_seq, topic]`` replays the stream of that topic (an engine's).

Snapshot (kvstore's own, on the replay socket): a request ``[b"", b"snapshot"]`` is answered with one batch
``[b"", topic, seq, payload]`` holding ``AllBlocksCleared`` and then a ``BlockStored`` for everything held now,
per medium, then the end marker (``[b"", b"snapshot", topic]``: what that topic's engines' namespaces hold, at
their rank). ``seq`` is the last batch the snapshot reflects: a consumer applies it in
place of every batch up to ``seq`` and goes on from ``seq + 1``.

Block hashes: 64-bit integers, as vLLM sends them by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``): for a
chunk keyed by our 16-byte chunk key, the key's last 8 bytes read big-endian, the same reduction vLLM applies to
its own hash bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"
FORMATS = ("map", "array")
END_SEQ = (-1).to_bytes(8, "big", signed=True)
SNAPSHOT_REQUEST = b"snapshot"
INCARNATION_KEY = "kvstore_incarnation"
DATA_PARALLEL_RANK = 0
_MASK64 = (1 << 64) - 1


def block_hash(key: bytes) -> int:
    """The 64-bit block hash a chunk key is published under (vLLM's reduction of hash bytes to an int)."""
    return int.from_bytes(key, "big") & _MASK64


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


# One KV cache group of an engine's chunks, as vLLM's events name it: (group_idx, kv_cache_spec_kind,
# kv_cache_spec_sliding_window)
Group = tuple[int, str, "int | None"]


@dataclass
class Stored:
    """Blocks entered a tier: ``hashes`` in chain order, ``parent`` the hash before the first (None: none);
    ``group``: the engine's KV cache group they are of (None: not said, a chunk of every group)."""

    hashes: list[int]
    parent: int | None
    medium: str
    block_size: int
    token_ids: list[int] = field(default_factory=list)
    group: Group | None = None


@dataclass
class Removed:
    """The tier's last copy of these blocks went."""

    hashes: list[int]
    medium: str
    group: Group | None = None


@dataclass
class Cleared:
    """Every block of the publisher is gone (a start, or a clear of all it held)."""


Event = Stored | Removed | Cleared


def _as_map(event: Event, incarnation: str) -> dict[str, Any]:
    if isinstance(event, Stored):
        body: dict[str, Any] = {"type": "BlockStored", "block_hashes": event.hashes,
                                "parent_block_hash": event.parent, "token_ids": event.token_ids,
                                "block_size": event.block_size, "lora_id": None, "medium": event.medium,
                                "lora_name": None}
        if event.group is not None:
            body.update(group_idx=event.group[0], kv_cache_spec_kind=event.group[1],
                        kv_cache_spec_sliding_window=event.group[2])
    elif isinstance(event, Removed):
        body = {"type": "BlockRemoved", "block_hashes": event.hashes, "medium": event.medium}
        if event.group is not None:
            body["group_idx"] = event.group[0]
    else:
        body = {"type": "AllBlocksCleared"}
    body[INCARNATION_KEY] = incarnation
    return body


def _as_array(event: Event, incarnation: str) -> list[Any]:
    if isinstance(event, Stored):
        return ["BlockStored", event.hashes, event.parent, event.token_ids, event.block_size, None, event.medium,
                incarnation]
    if isinstance(event, Removed):
        return ["BlockRemoved", event.hashes, event.medium, incarnation]
    return ["AllBlocksCleared", incarnation]


def encoded_events(events: list[Event], fmt: str, incarnation: str) -> list[Any]:
    """The ``events`` element of an ``EventBatch``, to pack with msgpack (``fmt``: "map" or "array")."""
    encode = _as_map if fmt == "map" else _as_array
    return [encode(e, incarnation) for e in events]


def batch_body(ts: float, events: list[Event], fmt: str, incarnation: str,
               rank: int = DATA_PARALLEL_RANK) -> list[Any]:
    """The ``EventBatch`` array to pack with msgpack (``fmt``: "map" or "array")."""
    return [ts, encoded_events(events, fmt, incarnation), rank]


_ARRAY_OF_3 = b"\x93"   # msgpack's fixarray header of three elements


def array_header(count: int) -> bytes:
    """msgpack's header of an array of ``count`` elements (what precedes them, packed one after the other)."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def batch_bytes(packer: Any, ts: float, packed_events: bytes, rank: int) -> bytes:
    """A packed ``EventBatch`` from its events packed once (``packer.pack(encoded_events(...))``): byte for byte
    what packing ``[ts, events, rank]`` gives, so a batch sent to several engines of different ranks packs its
    events once."""
    return b"".join((_ARRAY_OF_3, packer.pack(ts), packed_events, packer.pack(rank)))


def packed_ints(packer: Any, values: tuple[int, ...] | list[int]) -> bytes:
    """``values`` packed one after the other, without the array header (``array_header(len(values))`` before them
    gives exactly ``packer.pack(list(values))``)."""
    n = len(values)
    packed = packer.pack(values)
    return packed[1 if n < 16 else 3 if n < 1 << 16 else 5:]


def packed_hash(h: int) -> bytes:
    """One 64-bit block hash packed as msgpack packs it (the usual case, at least 2**32, without a packer)."""
    return b"\xcf" + h.to_bytes(8, "big") if h >> 32 else packed_ints(_PACKER, (h,))


@dataclass(slots=True)
class PackedRun:
    """A ``BlockStored`` of one chain run whose hashes and token ids are already packed (``packed_ints``), in
    pieces: a snapshot assembled from the pieces each held chunk keeps, without packing an integer again."""

    hashes: list[bytes]
    n_hashes: int
    parent: int | None
    block_size: int
    tokens: list[bytes]
    n_tokens: int


def packed_stored(packer: Any, run: PackedRun, medium: str, fmt: str, incarnation: str) -> bytes:
    """``run`` as one packed event: byte for byte ``packer.pack`` of what ``encoded_events`` makes of the same
    ``Stored``."""
    hashes = array_header(run.n_hashes) + b"".join(run.hashes)
    tokens = array_header(run.n_tokens) + b"".join(run.tokens)
    pack = packer.pack
    if fmt == "map":
        return b"".join((_STORED_MAP_HEAD, hashes, _PARENT_KEY, pack(run.parent), _TOKENS_KEY, tokens,
                         _SIZE_KEY, pack(run.block_size), _LORA_ID_KEY, pack(medium), _LORA_NAME_KEY,
                         pack(incarnation)))
    return b"".join((_STORED_ARRAY_HEAD, hashes, pack(run.parent), tokens, pack(run.block_size), b"\xc0",
                     pack(medium), pack(incarnation)))


_PACKER = msgpack.Packer()   # constants only, at import
_STORED_MAP_HEAD = b"\x89" + b"".join(_PACKER.pack(x) for x in ("type", "BlockStored", "block_hashes"))
_PARENT_KEY = _PACKER.pack("parent_block_hash")
_TOKENS_KEY = _PACKER.pack("token_ids")
_SIZE_KEY = _PACKER.pack("block_size")
_LORA_ID_KEY = _PACKER.pack("lora_id") + b"\xc0" + _PACKER.pack("medium")
_LORA_NAME_KEY = _PACKER.pack("lora_name") + b"\xc0" + _PACKER.pack(INCARNATION_KEY)
_STORED_ARRAY_HEAD = b"\x98" + _PACKER.pack("BlockStored")


_ARRAY_FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                 "medium"),
                 "BlockRemoved": ("block_hashes", "medium"),
                 "AllBlocksCleared": ()}


def event_as_dict(raw: Any) -> dict[str, Any]:
    """One decoded event, map or array form, as a map with ``type`` (for printing and for our consumers).

    Raises:
        ValueError: the event is neither form, or of a type this format does not define.
    """
    if isinstance(raw, dict):
        kind = raw.get("type")
        if kind not in _ARRAY_FIELDS:
            raise ValueError(f"unknown event type {kind!r}")
        return dict(raw)
    if isinstance(raw, (list, tuple)) and raw and raw[0] in _ARRAY_FIELDS:
        names = _ARRAY_FIELDS[raw[0]]
        out: dict[str, Any] = {"type": raw[0], **dict(zip(names, raw[1:]))}
        if len(raw) > len(names) + 1:
            out[INCARNATION_KEY] = raw[len(names) + 1]
        return out
    raise ValueError(f"not a KV cache event: {raw!r:.80}")


def split_batch(raw: Any) -> tuple[float, list[dict[str, Any]], int | None]:
    """A decoded ``EventBatch`` payload as (ts, events as maps, data_parallel_rank).

    Raises:
        ValueError: the payload is not an ``EventBatch``.
    """
    if not isinstance(raw, (list, tuple)) or len(raw) < 2 or not isinstance(raw[1], (list, tuple)):
        raise ValueError("not an EventBatch: expected [ts, events, data_parallel_rank]")
    rank = raw[2] if len(raw) > 2 else None
    return float(raw[0]), [event_as_dict(e) for e in raw[1]], rank
