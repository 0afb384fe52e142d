"""Checks of what callers pass to the Client: a wrong argument is a ``UsageError`` naming the call, the argument
and what it accepts, raised before anything is sent, never a ``TypeError`` from deep inside.

Each public method checks its arguments here, once. The checks cost the data path no Python work per chunk
beyond what it does anyway: a list or tuple is recognised by its type (one test for the whole batch); keys are
packed end to end in C, and the packed keys are what the call then sends and walks (a key that is not 16 bytes
of bytes fails the packing); buffers and destinations go through the one conversion each call makes of them
anyway (a memoryview, a size), whose ``TypeError`` becomes the ``UsageError``. Finding which item was wrong, and
saying so, happens only once a check has failed. Token ids are checked where they become bytes
(``kvstore/keys.py``), as ``kvstore.chunk_keys`` takes them too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Callable, TypeVar

from ..errors import UsageError
from ..keys import KEY_BYTES
from ..protocol.engine_blocks import EngineBlocks, engine_field
from ..protocol.messages import check_batch
from ..protocol.retention import RetentionAsk, parse_retention, wire_retention

T = TypeVar("T")

KEYS = f"{KEY_BYTES}-byte keys (bytes, as chunk_keys makes them)"
BUFFERS = "bytes-like objects (bytes, bytearray, memoryview, a numpy array) or torch tensors"
DESTS = "writable buffers (bytearray, a writable memoryview or numpy array) or torch tensors"


def describe(value: Any) -> str:
    """What a wrong value is, for a message: its type, and the value itself when it is short."""
    kind = type(value).__name__
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value) if value is not None else "None"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"a {kind} of {memoryview(value).nbytes} bytes"
    if isinstance(value, str):
        return f"a str ({value[:20]!r}{'...' if len(value) > 20 else ''})"
    return f"a {kind}"


def sequence(call: str, name: str, value: Any, of: str) -> Sequence[Any]:
    """``value`` as a list or tuple of items (any other sequence is copied into a list); refuses strings, single
    keys or buffers, iterators and generators (they could be read only once), and anything else."""
    if type(value) is list or type(value) is tuple:
        return value
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray, memoryview)):
        return list(value)
    hint = ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        hint = f" (one {name[:-1] if name.endswith('s') else name}?): wrap it in a list"
    elif hasattr(value, "__next__") or (hasattr(value, "__iter__") and not isinstance(value, str)):
        hint = ": pass list(...) of it"
    raise UsageError(f"{call}: {name} must be a list or tuple of {of}; got {describe(value)}{hint}")


def packed_keys(call: str, keys: Any, name: str = "keys") -> tuple[Sequence[bytes], bytes]:
    """``keys`` as a list or tuple, and packed end to end (what a request carries and the shared index walks)."""
    keys = sequence(call, name, keys, KEYS)
    check_batch(keys, call)   # before any copy: more keys than one request carries is the daemon's LimitError
    try:
        packed = b"".join(keys)
    except TypeError:
        raise _bad_key(call, name, keys) from None
    if len(packed) != KEY_BYTES * len(keys) or (keys and max(map(len, keys)) != KEY_BYTES):
        raise _bad_key(call, name, keys)
    return keys, packed


def _bad_key(call: str, name: str, keys: Sequence[Any]) -> UsageError:
    for i, key in enumerate(keys):
        if not isinstance(key, (bytes, bytearray, memoryview)) or len(key) != KEY_BYTES:
            return UsageError(f"{call}: {name}[{i}] is {describe(key)}; {name} must be {KEYS}")
    return UsageError(f"{call}: {name} must be {KEYS}")


def optional_key(call: str, name: str, value: Any) -> bytes | None:
    """A single key or None (a put's ``parent``)."""
    if value is None or (type(value) is bytes and len(value) == KEY_BYTES):
        return value
    raise UsageError(f"{call}: {name} must be None or one {KEY_BYTES}-byte key (bytes); got {describe(value)}")


def each(call: str, name: str, values: Any, convert: Callable[[Any], T], of: str) -> list[T]:
    """``convert`` of each of ``values`` (a list or tuple); the item it refuses (a TypeError, or a UsageError of
    its own) named in the UsageError."""
    values = sequence(call, name, values, of)
    try:
        return [convert(v) for v in values]
    except (TypeError, UsageError):
        pass
    for i, value in enumerate(values):   # once, to say which one
        try:
            convert(value)
        except TypeError:
            raise UsageError(f"{call}: {name}[{i}] is {describe(value)}; {name} must be {of}") from None
        except UsageError as exc:
            raise UsageError(f"{call}: {name}[{i}]: {exc}") from None
    raise UsageError(f"{call}: {name} must be {of}")


def same_length(call: str, keys: Sequence[Any], name: str, values: Sequence[Any]) -> None:
    if len(keys) != len(values):
        raise UsageError(f"{call}: {len(keys)} keys but {len(values)} {name}; give one per key")


def sizes(call: str, values: Any) -> list[int]:
    """Slot sizes in bytes (a reserve's): positive integers."""
    values = sequence(call, "sizes", values, "positive integers (bytes)")
    for i, size in enumerate(values):
        if type(size) is not int or size <= 0:
            raise UsageError(f"{call}: sizes[{i}] is {describe(size)}; sizes must be positive integers (bytes)")
    return list(values)


def positive_seconds(call: str, name: str, value: Any) -> float:
    """A timeout: a finite number of seconds above 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise UsageError(f"{call}: {name} must be a positive, finite number of seconds; got {describe(value)}")
    return float(value)


def positive_int(call: str, name: str, value: Any) -> int:
    if type(value) is not int or value <= 0:
        raise UsageError(f"{call}: {name} must be a positive integer; got {describe(value)}")
    return value


def non_negative(call: str, name: str, value: Any) -> int:
    if type(value) is not int or value < 0:
        raise UsageError(f"{call}: {name} must be an integer of 0 or more; got {describe(value)}")
    return value


def text(call: str, name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise UsageError(f"{call}: {name} must be a non-empty string; got {describe(value)}")
    return value


def engine_blocks(call: str, keys: Sequence[Any], engine: Any) -> dict[str, Any] | None:
    """The put's ``engine`` wire field from one ``EngineBlocks`` (or None) per key; None when none is given."""
    if engine is None:
        return None
    engine = list(engine)
    same_length(call, keys, "engine entries", engine)
    sizes = {e.block_size for e in engine if e is not None}
    if any(e is not None and not isinstance(e, EngineBlocks) for e in engine):
        raise UsageError(f"{call}: engine must hold an EngineBlocks or None per key")
    if len(sizes) > 1:
        raise UsageError(f"{call}: engine blocks of one put must share one block size, got {sorted(sizes)}")
    if not sizes:
        return None
    return engine_field(sizes.pop(), engine)


def retention(call: str, name: Any, pin_ttl: Any) -> RetentionAsk:
    """A put's retention class and pin TTL (``protocol/retention.py``), or UsageError naming what is allowed."""
    try:
        return parse_retention(name, pin_ttl)
    except ValueError as exc:
        raise UsageError(f"{call}: {exc}") from None


def write_fields(call: str, keys: Sequence[Any], engine: Any, ask: RetentionAsk) -> dict[str, Any]:
    """The wire fields a put or a reserve adds to its request: the engine's blocks (``engine_blocks``, checked)
    and the retention class asked for."""
    blocks = engine_blocks(call, keys, engine)
    return {**({"engine": blocks} if blocks is not None else {}), **wire_retention(ask)}
