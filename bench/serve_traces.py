"""Mooncake-format traces for `vllm bench serve --dataset-name timed_trace`: conversations, a slice, unique prompts.

A row is one request: ``{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}``.
Each hash id stands for one block of ``block_tokens`` tokens, and ids are prefix-chained as in Mooncake's
traces: two requests share a hash id at a position only when everything before it is shared too. vLLM's
client turns an id into tokens with Python's ``hash(f"{id}:{size}")`` as a seed, so the same id gives the same
tokens across processes only with ``PYTHONHASHSEED`` pinned (the harness does); a request's tokens are its ids'
blocks in order, cut to ``input_length``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Conversations:
    """A conversation workload: `sessions` chats of `turns` turns over `systems` shared system prompts.

    Turn t of a session sends the system prompt, then every earlier turn's blocks, then `turn_blocks` new
    ones: the context grows by `turn_blocks` blocks a turn. Sessions start `session_gap_ms` apart and a
    session's turns come `turn_gap_ms` apart (a user reading and typing), each request up to `jitter_ms` later
    (seeded): without it, arrivals of a fixed rhythm would give a round-robin router the same replica for every
    turn of a session, or never the same one, by the arithmetic of the gaps alone."""

    sessions: int = 16
    turns: int = 6
    systems: int = 2
    system_blocks: int = 4
    turn_blocks: int = 2
    block_tokens: int = 256
    output_tokens: int = 16
    session_gap_ms: int = 500
    turn_gap_ms: int = 4000
    seed: int = 0
    jitter_ms: int = 0

    def __post_init__(self) -> None:
        for name in ("sessions", "turns", "systems", "system_blocks", "turn_blocks", "block_tokens",
                     "output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"conversations: {name} must be at least 1, got {getattr(self, name)}")
        if min(self.session_gap_ms, self.turn_gap_ms, self.jitter_ms) < 0:
            raise ValueError("conversations: session_gap_ms, turn_gap_ms and jitter_ms must be >= 0")
        if self.turns > 1 and self.jitter_ms >= self.turn_gap_ms:
            raise ValueError(f"conversations: jitter_ms ({self.jitter_ms}) must be below turn_gap_ms "
                             f"({self.turn_gap_ms}), or a session's turns could arrive out of order")

    def longest_prompt(self) -> int:
        return (self.system_blocks + self.turns * self.turn_blocks) * self.block_tokens

    def unique_tokens(self) -> int:
        """Tokens of distinct KV the whole trace makes (the working set of a prefix cache)."""
        return (self.systems * self.system_blocks + self.sessions * self.turns * self.turn_blocks) * self.block_tokens


def conversation_trace(c: Conversations) -> list[dict]:
    """The rows of `c`, in arrival order."""
    rng = random.Random(c.seed)
    late = random.Random(c.seed + 1)   # its own stream: a trace without jitter is what it was before jitter
    next_id = c.systems * c.system_blocks  # ids below this are the system prompts'
    rows = []
    for s in range(c.sessions):
        system = rng.randrange(c.systems)
        context = list(range(system * c.system_blocks, (system + 1) * c.system_blocks))
        for t in range(c.turns):
            context = context + list(range(next_id, next_id + c.turn_blocks))
            next_id += c.turn_blocks
            jitter = late.randint(0, c.jitter_ms) if c.jitter_ms else 0
            rows.append({"timestamp": s * c.session_gap_ms + t * c.turn_gap_ms + jitter,
                         "input_length": len(context) * c.block_tokens, "output_length": c.output_tokens,
                         "hash_ids": list(context), "session": s, "turn": t})
    rows.sort(key=lambda r: (r["timestamp"], r["session"]))
    return rows


def unique_trace(n: int, blocks: int, block_tokens: int, output_tokens: int, gap_ms: int = 100,
                 first_id: int = 10_000_000) -> list[dict]:
    """`n` requests sharing nothing (every block id new): the all-miss workload."""
    if n < 1 or blocks < 1:
        raise ValueError(f"unique trace: n and blocks must be at least 1, got {n} and {blocks}")
    return [{"timestamp": i * gap_ms, "input_length": blocks * block_tokens, "output_length": output_tokens,
             "hash_ids": list(range(first_id + i * blocks, first_id + (i + 1) * blocks))} for i in range(n)]


def read_rows(path: str, limit: int) -> Iterator[dict]:
    """The first `limit` rows of a Mooncake JSON-lines trace (each checked for the four fields)."""
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if lineno > limit:
                return
            row = json.loads(line)
            missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in row]
            if missing:
                raise ValueError(f"{path}:{lineno}: a trace row needs {missing}; Mooncake rows have "
                                 "timestamp, input_length, output_length and hash_ids")
            yield row


def scaled_slice(rows: Iterable[dict], trace_block: int, block_tokens: int, max_blocks: int,
                 output_tokens: int, time_scale: float) -> list[dict]:
    """A trace slice scaled to a small model: each `trace_block`-token block becomes `block_tokens` tokens (the
    ids and their prefix sharing kept), prompts cut to `max_blocks` blocks, outputs to `output_tokens`, and
    timestamps multiplied by `time_scale`."""
    if min(trace_block, block_tokens, max_blocks, output_tokens) < 1 or time_scale <= 0:
        raise ValueError("scaled slice: block sizes, max_blocks and output_tokens must be >= 1, time_scale > 0")
    out = []
    for row in rows:
        ids = list(row["hash_ids"])[:max_blocks]
        length = -(-int(row["input_length"]) * block_tokens // trace_block)  # rounded up: never empty
        length = max(1, min(length, len(ids) * block_tokens))
        out.append({"timestamp": round(float(row["timestamp"]) * time_scale), "input_length": length,
                    "output_length": max(1, min(int(row["output_length"]), output_tokens)), "hash_ids": ids})
    return out


def shift(rows: list[dict], start_ms: int = 0) -> list[dict]:
    """The rows with timestamps moved so the first is `start_ms` (a trace half replayed on its own)."""
    if not rows:
        return []
    base = rows[0]["timestamp"]
    return [{**r, "timestamp": r["timestamp"] - base + start_ms} for r in rows]


def halves(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """The trace cut in two at its middle request, each half starting at time 0."""
    mid = len(rows) // 2
    return shift(rows[:mid]), shift(rows[mid:])


def working_set_tokens(rows: Iterable[dict], block_tokens: int) -> int:
    """Tokens of distinct full blocks the rows touch (what a prefix cache needs to hold all of them)."""
    seen: set[int] = set()
    for row in rows:
        seen.update(row["hash_ids"][: int(row["input_length"]) // block_tokens])
    return len(seen) * block_tokens


def write_jsonl(rows: Iterable[dict], path: str) -> str:
    """Write rows as the client reads them (the four Mooncake fields only); returns `path`."""
    with open(path, "w") as f:
        f.writelines(json.dumps({k: r[k] for k in ("timestamp", "input_length", "output_length", "hash_ids")})
                    + "\n" for r in rows)
    return path


def conversation_slice(rows: Iterable[dict], conversations: int, min_turns: int = 2) -> list[dict]:
    """The rows of the first `conversations` multi-turn conversations in a Mooncake trace, in arrival order.

    A conversation is the rows sharing their second hash id (the first is the system prompt every row
    shares): the turns that reuse each other's context, which a plain prefix of the trace mostly lacks."""
    groups: dict[int, list[dict]] = {}
    for row in rows:
        if len(row["hash_ids"]) > 1:
            groups.setdefault(row["hash_ids"][1], []).append(row)
    chosen = [g for g in groups.values() if len(g) >= min_turns][:conversations]
    return sorted((r for g in chosen for r in g), key=lambda r: float(r["timestamp"]))


def compress_time(rows: list[dict], span_ms: int) -> list[dict]:
    """The rows with arrival times squeezed (keeping their order and proportions) into `span_ms`."""
    if not rows:
        return []
    first, last = rows[0]["timestamp"], rows[-1]["timestamp"]
    scale = span_ms / (last - first) if last > first else 0.0
    return [{**r, "timestamp": round((r["timestamp"] - first) * scale)} for r in rows]
