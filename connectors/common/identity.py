"""Who an engine is to its router: the identity every connector sends at hello (``kvstore.protocol.engine_identity``),
so that the daemon publishes the KV cache events of the engine's namespace on the engine's own topic."""

from __future__ import annotations

import re
import socket

from kvstore.errors import BadRequestError, ConfigError, LimitError
from kvstore.protocol.engine_identity import MAX_ENGINE_ID_CHARS, EngineIdentity, read_identity


def engine_identity(engine_id: str | None, model: str | None, served_model: str, dp_rank: int = 0,
                    dp_size: int = 1) -> EngineIdentity:
    """The identity to send, from what was configured and what the engine says.

    Args:
        engine_id: the configured engine id (None: the host name, a pod's name under Kubernetes, with
            "-dp<rank>" when the engine runs several data-parallel ranks).
        model: the configured model name for the topic (None: ``served_model``, its "@" and spaces made "_").
        served_model: the model name the engine serves.
        dp_rank: the engine's data-parallel rank.
        dp_size: how many data-parallel ranks it runs.
    Returns:
        The identity, checked as the daemon checks it.
    Raises:
        ConfigError: a configured engine id or model name the daemon would refuse (one line naming it).
    """
    default_id = _sanitized(socket.gethostname(), r"[^A-Za-z0-9._:/-]") + (f"-dp{dp_rank}" if dp_size > 1 else "")
    wire = {"engine_id": engine_id or default_id,
            "model": model if model is not None else _sanitized(served_model, r"[@\s\x00-\x1f\x7f]"),
            "dp_rank": dp_rank}
    try:
        identity = read_identity(wire)
    except (BadRequestError, LimitError) as exc:
        raise ConfigError(f"kvstore engine_id/served_model_name: {exc}") from None
    assert identity is not None
    return identity


def _sanitized(text: str, bad: str) -> str:
    """``text`` with every character matching ``bad`` made "_" (a default name the daemon accepts)."""
    return re.sub(bad, "_", text)[:MAX_ENGINE_ID_CHARS] or "engine"
