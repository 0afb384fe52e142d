"""A request's retention class: whether the connector may save what the request computes.

A request asks for one through its ``kv_transfer_params`` (vLLM hands the connector
``SamplingParams.extra_args["kv_transfer_params"]``; the OpenAI server fills it from the request body's
``kv_transfer_params``), field ``kvstore_retention``:

- ``normal`` (the default): loads and saves as configured;
- ``no-store``: loads still happen, but nothing the request computes is saved.

An unknown value is ignored (the request runs as ``normal``) with one warning line naming it.
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any

log = logging.getLogger("kvstore.connectors.vllm")

RETENTION_FIELD = "kvstore_retention"


class Retention(str, Enum):
    """What the connector keeps of one request's KV."""

    NORMAL = "normal"
    NO_STORE = "no-store"

    @property
    def saves(self) -> bool:
        """Whether the request's computed chunks may be saved."""
        return self is not Retention.NO_STORE


ALLOWED = ", ".join(r.value for r in Retention)


def retention_of(kv_transfer_params: Any, req_id: str = "") -> Retention:
    """The retention class asked for in a request's ``kv_transfer_params`` (None, or a mapping without the
    field: ``normal``). A value that is not one of `Retention`'s is ignored with a warning: never an error."""
    if not isinstance(kv_transfer_params, dict) or RETENTION_FIELD not in kv_transfer_params:
        return Retention.NORMAL
    value = kv_transfer_params[RETENTION_FIELD]
    try:
        return Retention(value)
    except (ValueError, TypeError):  # TypeError: an unhashable value
        log.warning("kvstore: request %s asks for %s=%r, which is not one of %s: ignored (the request runs as %r)",
                    req_id or "?", RETENTION_FIELD, value, ALLOWED, Retention.NORMAL.value)
        return Retention.NORMAL
