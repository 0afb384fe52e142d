"""What a client asks of its daemon: the constructor's arguments, checked once, and the hello they make.

Owns the checks of ``Client``'s connect arguments (a wrong one is a UsageError, raised before any socket is
opened) and the HELLO message built from them, again at every hello after a daemon restart. The settings never
change for the life of a client. May call: ``arguments.py``, the key and protocol leaves; nothing that sends.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

from ..defaults import default_socket
from ..errors import UsageError
from ..keys import KEY_SCHEME
from ..procinfo import self_identity
from ..protocol.engine_identity import EngineIdentity
from ..protocol.wire import PROTOCOL_VERSION, Op
from . import arguments

DEFAULT_NAMESPACE = "default"
DEFAULT_CHUNK_TOKENS = 256


@dataclass(frozen=True)
class ClientSettings:
    """One client's connect arguments, checked (see ``Client`` for what each means)."""

    address: str             # ipc:///path or tcp://host:port
    namespace: str
    chunk_tokens: int
    timeout: float           # seconds to wait for each reply
    client_id: str
    key_scheme: str          # how the client's keys are made: a daemon holding the namespace made otherwise refuses
    hash_seed: int
    use_arena: bool          # map the daemon's arena (local clients)
    want_stream: bool        # send requests on the daemon's stream socket when it has one (local clients)
    want_gpu: bool           # map the GPU tier's pool
    want_shared_index: bool  # answer lookups from the daemon's shared-memory index
    pin_arena: bool          # page-lock the arena mappings (CUDA)
    connector: dict[str, str] | None    # an engine connector's report of itself, shown by `kvstore stats`
    identity: EngineIdentity | None     # the engine instance served: its KV cache events go on its topic

    @classmethod
    def checked(cls, address: str | None, namespace: str, chunk_tokens: int, timeout: float,
                client_id: str | None = None, use_arena: bool | None = None, gpu: bool = False,
                pin_arena: bool = False, key_scheme: str = KEY_SCHEME, hash_seed: int = 0,
                shared_index: bool = True, stream: bool = True, connector: dict[str, str] | None = None,
                identity: EngineIdentity | None = None) -> ClientSettings:
        """The settings of ``Client``'s constructor arguments (the same names).

        Returns:
            The checked settings, with defaults filled in: the default socket of ``kvstore serve`` for a None
            ``address``, a fresh ``client_id``, ``use_arena`` for ipc:// addresses.

        Raises:
            UsageError: an argument is not one the client accepts (the message names it).
        """
        address = address or "ipc://" + default_socket()
        if not isinstance(address, str) or not address.startswith(("ipc://", "tcp://")):
            hint = f" (a socket path? use ipc://{address})" if str(address).startswith("/") else ""
            raise UsageError(f"address must start with ipc:// or tcp://, got {address!r}{hint}")
        arguments.positive_int("connect", "chunk_tokens", chunk_tokens)
        namespace = arguments.text("connect", "namespace", namespace)
        timeout = arguments.positive_seconds("connect", "timeout", timeout)
        if identity is not None and not isinstance(identity, EngineIdentity):
            raise UsageError(f"identity must be a kvstore.protocol.engine_identity.EngineIdentity, "
                             f"got {type(identity).__name__}")
        local = address.startswith("ipc://")
        use_arena = local if use_arena is None else use_arena
        return cls(address, namespace, chunk_tokens, timeout,
                   client_id or f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
                   key_scheme, hash_seed, use_arena, want_stream=stream and local, want_gpu=gpu and use_arena,
                   want_shared_index=shared_index and use_arena, pin_arena=pin_arena, connector=connector,
                   identity=identity)

    def hello(self) -> dict[str, Any]:
        """The HELLO request these settings make (this process's pid and start time included)."""
        pid, pid_start = self_identity()
        return {
            "op": Op.HELLO, "version": PROTOCOL_VERSION, "namespace": self.namespace,
            "client_id": self.client_id, "chunk_tokens": self.chunk_tokens,
            "pid": pid, "pid_start": pid_start, "arena": self.use_arena, "gpu": self.want_gpu,
            "key_scheme": self.key_scheme, "hash_seed": self.hash_seed,
            **({"connector": self.connector} if self.connector else {}),
            **({"identity": self.identity.wire()} if self.identity is not None else {}),
        }
