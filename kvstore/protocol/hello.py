"""HELLO, the first request of every session: what a client says of itself before anything else.

The protocol version, the namespace its keys live in, how it cuts and keys chunks (checked against what the
namespace already holds, ``server/requests/compat.py``), its process (followed for its leases) and what it
wants mapped, and, from an engine connector, its report (engine, model family, on or off and why) and the engine
instance it serves (``engine_identity.py``). The bounds on names are here too; the connectors cut their reports
to them.

May call the field readers (``fields.py``), the engine's identity (``engine_identity.py``) and the leaves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import BadRequestError, LimitError
from ..keys import KEY_SCHEME
from .engine_identity import EngineIdentity, read_identity
from .fields import read_bool, read_int, read_str

MAX_NAMESPACE_CHARS = 512
MAX_CLIENT_ID_CHARS = 256
MAX_CONNECTOR_FAMILY_CHARS = 64
MAX_CONNECTOR_REASON_CHARS = 400
CONNECTOR_STATES = ("on", "off")
_ENGINE_NAME = re.compile(r"[a-z0-9]{1,32}")


@dataclass(frozen=True)
class ConnectorReport:
    """What an engine connector says of itself at hello: which engine, which model family, on or off and why."""

    engine: str
    family: str
    state: str
    reason: str

    @classmethod
    def parse(cls, value: Any) -> "ConnectorReport | None":
        if value is None:
            return None
        if not isinstance(value, dict):
            raise BadRequestError(f"field 'connector' must be a map, got {type(value).__name__}")
        try:
            engine = read_str(value, "engine", 32)
            if not _ENGINE_NAME.fullmatch(engine):
                raise BadRequestError(f"engine {engine!r} must be 1-32 lowercase letters or digits")
            state = read_str(value, "state", 8)
            if state not in CONNECTOR_STATES:
                raise BadRequestError(f"state {state!r} must be one of {', '.join(CONNECTOR_STATES)}")
            return cls(engine, read_str(value, "family", MAX_CONNECTOR_FAMILY_CHARS, default=""), state,
                       read_str(value, "reason", MAX_CONNECTOR_REASON_CHARS, default=""))
        except (BadRequestError, LimitError) as exc:
            raise type(exc)(f"connector report: {exc}") from None


@dataclass(frozen=True)
class Hello:
    version: int
    namespace: str
    client_id: str
    chunk_tokens: int
    pid: int
    pid_start: int
    want_arena: bool
    want_gpu: bool
    key_scheme: str     # how the client derives chunk keys (kvstore.keys.KEY_SCHEME for our own)
    hash_seed: int      # a seed the client's key hash takes, 0 for none
    connector: ConnectorReport | None = None
    identity: EngineIdentity | None = None   # the engine instance the client serves (its events' topic)

    @classmethod
    def parse(cls, h: dict[str, Any]) -> "Hello":
        return cls(
            version=read_int(h, "version", 0, 1 << 16),
            namespace=read_str(h, "namespace", MAX_NAMESPACE_CHARS),
            client_id=read_str(h, "client_id", MAX_CLIENT_ID_CHARS, default=""),
            chunk_tokens=read_int(h, "chunk_tokens", 1, 1 << 20, default=256),
            pid=read_int(h, "pid", 0, 1 << 31, default=0),
            pid_start=read_int(h, "pid_start", 0, 1 << 62, default=0),
            want_arena=read_bool(h, "arena", default=False),
            want_gpu=read_bool(h, "gpu", default=False),
            key_scheme=read_str(h, "key_scheme", MAX_CLIENT_ID_CHARS, default=KEY_SCHEME),
            hash_seed=read_int(h, "hash_seed", 0, (1 << 64) - 1, default=0),
            connector=ConnectorReport.parse(h.get("connector")),
            identity=read_identity(h.get("identity")),
        )
