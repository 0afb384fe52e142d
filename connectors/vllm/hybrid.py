"""Hybrid models (attention interleaved with Mamba-2 or linear-attention layers): the recurrent state in a chunk.

A prefix of a hybrid model is two things: every attention layer's KV of every token, and each recurrent
layer's state (conv then SSM, or the delta-rule state) after the prefix's last token, a fixed size whatever
the prefix length, valid only at that exact token. vLLM keeps such states for prefix caching in its "align"
mode (`MambaSpec.mamba_cache_mode == "align"`): the recurrent layers form their own KV cache groups of raw
pages (``[blocks, ..., page_bytes]`` per layer), one block per `block_size` tokens, where block ``p`` of a
request holds the state after ``(p + 1) * block_size`` tokens while the step that wrote it is the latest.

What a chunk holds. One chunk of `chunk_tokens` tokens (which must equal the state groups' block size: a
state exists only at block boundaries) is every group's blocks of those tokens, as for attention-only models
(``geometry.py``), so a state group adds one state per layer: the state at the chunk's last token (its
page's state bytes, not the padding vLLM adds to make state and attention pages one size). It is one
object with the chunk's attention KV: checksummed, tiered and evicted together, never one without the other.
The state groups' layout (the state shapes and dtypes, the page size, the kind of layer) is part of the
chunk format, so a namespace never mixes states of two layouts.

Saves. vLLM writes a request's running state into the block of its last scheduled token and nulls older
state blocks at the next schedules, so a chunk's state is taken in `wait_for_save` of the step whose
computed tokens end exactly on the chunk's last token (in the step: `EngineGeometry.frees_blocks`). A
chunk computed in a step that goes on past it (its state already overwritten) is not saved; nor are the
states vLLM exports mid-step into prefill checkpoint blocks (`num_prefill_checkpoint_blocks`), which a
token budget of one block a step (what vLLM's CPU scan needs in align mode) never makes.

Loads. A loaded prefix ends on a chunk boundary: every chunk's attention KV, and the state of its last chunk
written into the block vLLM reads it from. For a load off the step (asynchronous) that is the block of the
last loaded chunk, which vLLM copies into the running block when the request is scheduled; for a load in the
step that block is the null block and vLLM has already made that copy, so the state goes into the running
block, the request's last allocated one (`state_target`). Without such a block the load is refused as a
failed one (vLLM recomputes the prefix), never a prefix with another state.

Events. vLLM publishes a hybrid model's cached blocks once per KV cache group (`group_idx`,
`kv_cache_spec_kind`: ``full_attention``, ``mamba``), so that a router counts a prefix only where the state
group holds it too. The connector names its groups at hello (`event_groups`, in the engine identity), and the
daemon publishes each chunk once per group the same way: a chunk holds them all, so their events always come
and go together, and no attention block is announced without its state.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..common.families import Unsupported
from ..common.layout import dtype_name

STATE_KIND = "state"   # GroupGeometry.kind of a recurrent-state group
NULL_BLOCK = 0         # vLLM's null block (as in ``geometry``)


def state_group_format(layer_names: Sequence[str], spec: Any, family: str, chunk_tokens: int) -> str:
    """The chunk format of one recurrent-state group (`MambaSpec`), for the namespace; raises `Unsupported`
    when the engine keeps no state a chunk can hold."""
    mode = getattr(spec, "mamba_cache_mode", "none")
    if mode != "align":
        raise Unsupported(family, "Mamba / linear-attention layers keep a recurrent state, stored only with vLLM's "
                                  f"prefix caching in its align mode (mamba_cache_mode is {mode!r}): enable prefix "
                                  "caching")
    if getattr(spec, "num_speculative_blocks", 0):
        raise Unsupported(family, "recurrent states with speculative decoding blocks have no chunk layout")
    if chunk_tokens != spec.block_size:
        raise Unsupported(family, f"chunk_tokens {chunk_tokens} must equal the hybrid block size {spec.block_size} "
                                  f"(a recurrent state exists only at block boundaries): set chunk_tokens to "
                                  f"{spec.block_size}")
    kind = getattr(getattr(spec, "mamba_type", None), "name", None) or str(getattr(spec, "mamba_type", "mamba"))
    shapes = "/".join("x".join(str(d) for d in shape) for shape in spec.shapes)
    dtypes = "/".join(dtype_name(d) for d in spec.dtypes)
    return (f"{STATE_KIND}(n={len(layer_names)},type={kind.lower()},shapes={shapes},dtypes={dtypes},"
            f"bytes={state_bytes(spec)},block={spec.block_size})")


def state_bytes(spec: Any) -> int:
    """The bytes of one layer's state a chunk holds: the state itself, not the padding vLLM adds to its page
    (`page_size_padded`, so that state and attention pages are the same size)."""
    return int(spec.state_content_size_bytes)


def state_rows(layer: torch.Tensor, nbytes: int) -> torch.Tensor:
    """One state layer's cache (``[blocks, ...]``, each block one page) as its pages' first `nbytes` bytes:
    a view (raises rather than copies when a page is not one run of memory)."""
    pages = layer.view(layer.shape[0], -1)
    if pages.shape[1] * pages.element_size() < nbytes:
        raise ValueError(f"a state page of {pages.shape[1] * pages.element_size()} bytes cannot hold a "
                         f"{nbytes}-byte state")
    return pages.view(torch.uint8)[:, :nbytes]


def state_saved_at(computed: int, chunk_tokens: int, block_ids: Sequence[int]) -> int | None:
    """The chunk whose state a state group holds at the end of a step that leaves `computed` tokens computed
    (None: the step did not end on a chunk boundary, or that chunk's state block is not the request's)."""
    if computed <= 0 or computed % chunk_tokens:
        return None
    chunk = computed // chunk_tokens - 1
    if chunk >= len(block_ids) or block_ids[chunk] == NULL_BLOCK:
        return None
    return chunk


def state_target(block_ids: Sequence[int], last_chunk: int) -> int | None:
    """The block a load writes the state of its last chunk `last_chunk` into: the request's last allocated
    block of the state group at or after that chunk's (None: there is none)."""
    for index in range(len(block_ids) - 1, last_chunk - 1, -1):
        if block_ids[index] != NULL_BLOCK:
            return block_ids[index]
    return None


def event_groups(kv_cache_config: Any) -> tuple[tuple[str, int | None], ...]:
    """The engine's KV cache groups as vLLM's KV cache events name them, (`kv_cache_spec_kind`, sliding window)
    in group order; () when a group is not transferred (a chunk would not hold every group vLLM indexes)."""
    from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window

    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if not all(getattr(g, "enable_kv_transfer", True) for g in groups):
        return ()
    return tuple((get_kv_cache_spec_kind(g.kv_cache_spec).value, get_kv_cache_spec_sliding_window(g.kv_cache_spec))
                 for g in groups)
