"""How an engine connector tells the daemon what it is, so that `kvstore stats` and /metrics show it.

A connector sends a report at hello: the engine (`vllm`, `sglang`, `hf`), the model family, whether it is on
and, when off, why (the one line it logged at start). A connector that is on sends it on its ordinary client;
one that is off holds a client open for the report alone (`hold_off_report`), so that an operator sees "vllm,
jamba, off: Mamba layers keep a recurrent state" instead of a connector that is silently doing nothing.
"""

from __future__ import annotations

import logging

import kvstore
from kvstore.protocol.hello import (
    MAX_CONNECTOR_FAMILY_CHARS,
    MAX_CONNECTOR_REASON_CHARS,
)

from .families import ChunkLayout, Unsupported

__all__ = ["hold_off_report", "off_report", "on_report", "refuse"]

log = logging.getLogger("kvstore.connectors")


def _report(engine: str, family: str, state: str, reason: str) -> dict[str, str]:
    return {"engine": engine, "family": family[:MAX_CONNECTOR_FAMILY_CHARS], "state": state,
            "reason": reason[:MAX_CONNECTOR_REASON_CHARS]}


def on_report(engine: str, layout: ChunkLayout) -> dict[str, str]:
    """The report of a connector serving `layout`."""
    return _report(engine, layout.family_label or layout.family.value, "on", layout.describe())


def off_report(engine: str, refusal: Unsupported) -> dict[str, str]:
    """The report of a connector that refused its engine's KV cache."""
    return _report(engine, refusal.family, "off", refusal.reason)


def refuse(address: str | None, engine: str, refusal: Unsupported, timeout: float = 2.0) -> kvstore.Client | None:
    """Log the one line saying why this connector is off (on the engine's connector logger), and hold the
    daemon's view of it as off."""
    logging.getLogger(f"kvstore.connectors.{engine}").warning(refusal.line(engine))
    return hold_off_report(address, engine, refusal, timeout)


def hold_off_report(address: str | None, engine: str, refusal: Unsupported,
                    timeout: float = 2.0) -> kvstore.Client | None:
    """A client that shows this connector as off while it stays open; None when no daemon answers."""
    try:
        return kvstore.connect(address, timeout=timeout, use_arena=False, connector=off_report(engine, refusal))
    except Exception as exc:  # noqa: BLE001 - the report is informational; the engine runs regardless
        log.debug("kvstore daemon not told that the %s connector is off: %s", engine, exc)
        return None


def state_report(engine: str, family: str, state: str, description: str) -> dict[str, str]:
    """A report for a connector whose layout is not a `ChunkLayout` (vLLM's block-format chunks)."""
    return _report(engine, family, state, description)
