"""The engine's own names for a chunk's tokens: its block hashes, block size, parent hash and token ids.

An engine connector that knows how its engine hashes blocks (vLLM: ``request.block_hashes``, 16 tokens a block
by default) sends them with each chunk it puts, so that the daemon's KV cache events name blocks the way the
engine's router keys them (``protocol/kv_events.py``). The daemon keeps this record with the chunk (``Entry
.engine``) in every tier and never reads the bytes by it: it is metadata for the events only.

Wire (an optional field ``engine`` on RESERVE, CREDIT_PUT and PUT_INLINE, append-only)::

    {"block_size": int, "chunks": [[block_hashes, parent_block_hash, token_ids] | None, ...]}

one element per key of the put (None: that chunk has no engine names; its events use the chunk key).
``block_hashes`` are unsigned 64-bit integers (vLLM's integer form of its hash bytes), ``parent_block_hash``
the hash of the block before the first (None at the start of a prompt), ``token_ids`` exactly
``block_size × len(block_hashes)`` non-negative integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BadRequestError, LimitError

MAX_ENGINE_BLOCKS = 1024          # engine blocks one chunk may name
MAX_ENGINE_BLOCK_SIZE = 1 << 16   # tokens per engine block
MAX_ENGINE_TOKENS = 1 << 17       # token ids one chunk may carry
MAX_TOKEN_ID = (1 << 32) - 1
_U64 = (1 << 64) - 1
_FIX = ("send engine block hashes as unsigned 64-bit integers, token_ids block_size per block, "
        "or leave 'engine' out")


@dataclass(frozen=True, slots=True)
class EngineBlocks:
    """The engine blocks one chunk holds, as the engine names them (kept on the entry, in every tier)."""

    block_size: int
    hashes: tuple[int, ...]
    parent: int | None
    token_ids: tuple[int, ...]

    def wire(self) -> list[Any]:
        """The ``[block_hashes, parent_block_hash, token_ids]`` element of the put's ``engine.chunks``."""
        return [list(self.hashes), self.parent, list(self.token_ids)]


def _bad(where: str, what: str) -> BadRequestError:
    return BadRequestError(f"field 'engine' {where}: {what}; {_FIX}")


def _read_ints(value: Any, where: str, hi: int, limit: int) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _bad(where, f"must be a list of integers, got {type(value).__name__}")
    if len(value) > limit:
        raise LimitError(f"field 'engine' {where} holds {len(value)} values; the limit is {limit}")
    for i, v in enumerate(value):
        if type(v) is not int or not 0 <= v <= hi:
            raise _bad(f"{where}[{i}]", f"{v!r:.40} is not an integer in [0, {hi}]")
    return tuple(value)


def read_engine_chunk(value: Any, block_size: int, where: str) -> EngineBlocks | None:
    """One element of ``engine.chunks`` (None stays None). Raises BadRequestError or LimitError."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 3:
        raise _bad(where, "must be [block_hashes, parent_block_hash, token_ids] or null")
    hashes = _read_ints(value[0], f"{where}.block_hashes", _U64, MAX_ENGINE_BLOCKS)
    if not hashes:
        raise _bad(f"{where}.block_hashes", "must not be empty")
    parent = value[1]
    if parent is not None and (type(parent) is not int or not 0 <= parent <= _U64):
        raise _bad(f"{where}.parent_block_hash", f"{parent!r:.40} is not an unsigned 64-bit integer or null")
    tokens = _read_ints(value[2], f"{where}.token_ids", MAX_TOKEN_ID, MAX_ENGINE_TOKENS)
    if len(tokens) != block_size * len(hashes):
        raise _bad(f"{where}.token_ids", f"holds {len(tokens)} ids for {len(hashes)} blocks of {block_size} "
                                          f"tokens (expected {block_size * len(hashes)})")
    return EngineBlocks(block_size, hashes, parent, tokens)


def read_engine(h: dict[str, Any], count: int) -> list[EngineBlocks | None] | None:
    """The put's optional ``engine`` field for its ``count`` keys (None when absent).

    Raises:
        BadRequestError: a field of the wrong type or shape (the message names it and how to fix it).
        LimitError: more blocks or token ids per chunk than the daemon keeps.
    """
    value = h.get("engine")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("", f"must be a map with 'block_size' and 'chunks', got {type(value).__name__}")
    size = value.get("block_size")
    if type(size) is not int or not 1 <= size <= MAX_ENGINE_BLOCK_SIZE:
        raise _bad("block_size", f"{size!r:.40} is not an integer in [1, {MAX_ENGINE_BLOCK_SIZE}]")
    chunks = value.get("chunks")
    if not isinstance(chunks, list) or len(chunks) != count:
        raise _bad("chunks", f"must be a list of {count} elements, one per key")
    return [read_engine_chunk(c, size, f"chunks[{i}]") for i, c in enumerate(chunks)]


def engine_field(block_size: int, chunks: list[EngineBlocks | None]) -> dict[str, Any]:
    """What a client sends as the put's ``engine`` field."""
    return {"block_size": block_size, "chunks": [None if c is None else c.wire() for c in chunks]}
