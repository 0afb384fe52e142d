"""What the vLLM connector's scheduler half sends its workers each step, and what it keeps per request.

The metadata crosses from the scheduler process to the workers (pickled by vLLM), so it holds plain values
only: token ids, block ids, counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass
class LoadSpec:
    """Load chunks `0 .. num_chunks` of a request, writing from token `skip_tokens` on."""

    req_id: str
    token_ids: list[int]
    block_ids: list[list[int]]   # per KV cache group
    num_chunks: int
    skip_tokens: int
    salt: str = ""               # the request's key root (``identity.RequestKeys.root``)
    is_async: bool = True
    extras: list[bytes] = field(default_factory=list)   # per chunk, what its key folds in beyond its tokens


@dataclass
class SaveSpec:
    """Save chunks `first_chunk .. first_chunk + num_chunks` of a request."""

    req_id: str
    token_ids: list[int]
    block_ids: list[list[int]]   # per KV cache group
    first_chunk: int
    num_chunks: int
    salt: str = ""
    verify: bool = False  # compare these computed chunks with the stored ones instead of saving them
    # The engine's block hashes of these chunks' blocks (vLLM's, as integers), the hash before the first, and
    # the engine's block size: sent with the chunks so the daemon's KV cache events name the engine's blocks.
    engine_hashes: list[int] = field(default_factory=list)
    engine_parent: int | None = None
    engine_block_size: int = 0
    retention: str = "normal"           # the request's retention class (``retention.py``), sent with the chunks
    pin_ttl: float | None = None        # with ``pin``: its TTL in seconds (None: the daemon's)
    extras: list[bytes] = field(default_factory=list)   # per chunk, what its key folds in beyond its tokens


@dataclass
class KVStoreConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)


@dataclass
class Tracked:
    """Scheduler-side state of one running request."""

    prompt: list[int]
    block_ids: list[list[int]]   # per KV cache group
    saved_chunks: int
    salt: str                    # the request's key root
    saving: bool = False  # a save was planned: its blocks outlive the request until the workers are done
    verify_chunks: int = 0  # leading chunks stored but computed, to be compared with the store
    verified_chunks: int = 0  # ... of which a comparison was planned
    extras: list[bytes] = field(default_factory=list)   # per prompt chunk, what its key folds in
    stale: bool = False     # saves nothing more (weights reset under it, or an input it cannot key)
