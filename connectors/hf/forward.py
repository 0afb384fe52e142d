"""How a transformers forward pass takes and returns a cache, on releases on either side of the rename of
``past_key_values`` to ``cache``: the connector's own passes (verification, a hybrid's chunked prefill) and its
callers use these two, so they never trip the deprecation warning."""

from __future__ import annotations

import inspect
from typing import Any

import torch


def cache_kwargs(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword argument that hands `cache` to `model`'s forward pass: `{"cache": cache}` where transformers
    names it so, `{"past_key_values": cache}` on releases before that rename."""
    parameters = inspect.signature(model.forward).parameters
    return {"cache": cache} if "cache" in parameters else {"past_key_values": cache}


def output_cache(output: Any) -> Any:
    """The cache a forward pass returned: `output.cache`, or `output.past_key_values` on releases before the
    rename (read without the deprecation warning the new releases give that name)."""
    fields = getattr(output, "__dataclass_fields__", None)   # transformers' outputs are dataclasses
    new_name = "cache" in fields if fields is not None else hasattr(output, "cache")
    return output.cache if new_name else output.past_key_values
