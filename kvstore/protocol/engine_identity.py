"""Whose cache it is: the identity an engine's client gives at hello, so that KV cache events reach its router.

Wire (an optional field ``identity`` of HELLO, append-only; a daemon that predates it ignores it, a client that
does not send it is a raw client whose chunks are published on the daemon's plain topic)::

    {"engine_id": str, "model": str, "dp_rank": int, "groups": [[kind, sliding_window | null], ...]}

``engine_id`` names the engine instance the way its router does (llm-d: the pod; a host name plus data-parallel
rank by default in the vLLM connector): 1-128 characters from letters, digits and ``._:/-``. ``model`` is the
served model name (0-256 characters, no ``@``, no white space or control characters: llm-d splits its topic
``kv@<engine>@<model>`` on ``@``). ``dp_rank`` is the engine's data-parallel rank, 0-65535, the
``data_parallel_rank`` of every batch published for it. ``groups`` (optional, appended later): the engine's KV
cache groups that each of its chunks holds, in vLLM's event vocabulary (``kv_cache_spec_kind``: 1-32 of
``[a-z_]``, and ``kv_cache_spec_sliding_window``), at most ``MAX_GROUPS``; given, the chunks of the session's
namespace are published once per group, each with its ``group_idx``, as vLLM publishes a hybrid model's blocks
(``store/events.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import BadRequestError, LimitError

MAX_ENGINE_ID_CHARS = 128
MAX_MODEL_CHARS = 256
MAX_DP_RANK = (1 << 16) - 1
MAX_GROUPS = 16
MAX_WINDOW = 1 << 30
_KIND = re.compile(r"[a-z_]{1,32}")
_ENGINE_ID = re.compile(r"[A-Za-z0-9._:/-]+")
_MODEL = re.compile(r"[^@\s\x00-\x1f\x7f]*")
_FIX = ("send {'engine_id': 1-128 of [A-Za-z0-9._:/-], 'model': up to 256 characters without '@' or spaces, "
        "'dp_rank': 0-65535, optionally 'groups': up to 16 [kind of [a-z_], sliding window or null]}, "
        "or leave 'identity' out")


@dataclass(frozen=True, slots=True)
class EngineIdentity:
    """One engine instance as its router names it."""

    engine_id: str
    model: str = ""
    dp_rank: int = 0
    groups: tuple[tuple[str, int | None], ...] = ()   # (kv_cache_spec_kind, sliding window) of each group

    def wire(self) -> dict[str, Any]:
        """The HELLO's ``identity`` field."""
        body: dict[str, Any] = {"engine_id": self.engine_id, "model": self.model, "dp_rank": self.dp_rank}
        if self.groups:
            body["groups"] = [list(g) for g in self.groups]
        return body


def _bad(what: str) -> BadRequestError:
    return BadRequestError(f"field 'identity' {what}; {_FIX}")


_PATTERNS = {"engine_id": _ENGINE_ID, "model": _MODEL}


def name_fault(kind: str, text: str, limit: int) -> str | None:
    """What is wrong with ``text`` as an ``engine_id`` or ``model`` (``kind``), None when nothing is."""
    if len(text) > limit:
        return f"is {len(text)} characters long; the limit is {limit}"
    if not _PATTERNS[kind].fullmatch(text):
        allowed = "1-128 of [A-Za-z0-9._:/-]" if kind == "engine_id" else "no '@', spaces or control characters"
        return f"{text!r:.60} holds a character that is not allowed ({allowed})"
    return None


def _read_text(value: dict[str, Any], name: str, limit: int, default: str | None) -> str:
    text = value.get(name, default)
    if not isinstance(text, str):
        raise _bad(f"{name}: must be a string, got {type(text).__name__}")
    fault = name_fault(name, text, limit)
    if fault and len(text) > limit:
        raise LimitError(f"field 'identity' {name} {fault}")
    if fault:
        raise _bad(f"{name}: {fault}")
    return text


def read_identity(value: Any) -> EngineIdentity | None:
    """The HELLO's optional ``identity`` field (None when absent).

    Args:
        value: the field as decoded from the wire.
    Returns:
        The identity, or None when the client sent none.
    Raises:
        BadRequestError: not a map, a field of the wrong type or with a character not allowed (one line naming it).
        LimitError: a string longer than its limit.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad(f"must be a map, got {type(value).__name__}")
    engine_id = _read_text(value, "engine_id", MAX_ENGINE_ID_CHARS, None)
    model = _read_text(value, "model", MAX_MODEL_CHARS, "")
    rank = value.get("dp_rank", 0)
    if type(rank) is not int or not 0 <= rank <= MAX_DP_RANK:
        raise _bad(f"dp_rank: {rank!r:.40} is not an integer in [0, {MAX_DP_RANK}]")
    return EngineIdentity(engine_id, model, rank, _read_groups(value.get("groups", [])))


def _read_groups(value: Any) -> tuple[tuple[str, int | None], ...]:
    if not isinstance(value, list):
        raise _bad(f"groups: must be a list, got {type(value).__name__}")
    if len(value) > MAX_GROUPS:
        raise LimitError(f"field 'identity' groups holds {len(value)} groups; the limit is {MAX_GROUPS}")
    groups = []
    for i, group in enumerate(value):
        if not isinstance(group, list) or len(group) != 2:
            raise _bad(f"groups[{i}]: must be [kind, sliding window or null]")
        kind, window = group
        if not isinstance(kind, str) or not _KIND.fullmatch(kind):
            raise _bad(f"groups[{i}] kind: {kind!r:.40} is not 1-32 of [a-z_]")
        if window is not None and (type(window) is not int or not 0 < window <= MAX_WINDOW):
            raise _bad(f"groups[{i}] sliding window: {window!r:.40} is not null or an integer in [1, {MAX_WINDOW}]")
        groups.append((kind, window))
    return tuple(groups)
