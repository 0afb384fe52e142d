"""What the daemon knows about one connected client."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...keys import KEY_SCHEME
from ...procinfo import process_start_time
from ...protocol.engine_identity import EngineIdentity
from ...protocol.hello import ConnectorReport
from ...tenants.access import AccessCache, Principal
from ...tenants.key_space import SessionKeys
from ...tenants.table import TenantTable
from .compat import KeyParams


@dataclass
class Session:
    owner: bytes           # transport tag + ZeroMQ routing id; owns leases and reservations
    transport: str         # "ipc" or "tcp"
    namespace: str
    client_id: str
    chunk_tokens: int
    arena: bool            # whether this client maps the shared arena (else bytes travel inline)
    pid: int = 0           # the client's process, tracked only when verified at hello (see track_process)
    pid_start: int = 0
    key_scheme: str = KEY_SCHEME
    hash_seed: int = 0
    connector: ConnectorReport | None = None  # what an engine connector said of itself at hello
    identity: EngineIdentity | None = None    # the engine instance it serves (KV cache events' topic), if said
    # Who the client is: known for stream connections (SO_PEERCRED), unknown (all None) on ZeroMQ.
    principal: Principal = field(default_factory=Principal)
    access: AccessCache | None = None   # what the principal may read under the table in force (handlers.py)
    # What its keys are mapped through (its tenant's key space, its namespace's binding: None until the first
    # request), and the table that was chosen under (Service.key_space).
    key_space: SessionKeys | None = None
    key_space_table: TenantTable | None = None
    # The daemon's own user or root, locally (local_access.may_map): may be offered the arena, and may reload.
    owner_local: bool = False

    @property
    def key_params(self) -> KeyParams:
        return KeyParams(self.chunk_tokens, self.key_scheme, self.hash_seed)

    def track_process(self, pid: int, pid_start: int) -> bool:
        """Follow the client's process so that its pins are reclaimed as soon as it dies.

        Only when the pid names the same process here (same start time): a client in another pid namespace
        sends a pid that means nothing to us, and such a client falls back to the lease and reservation TTLs.
        """
        if self.transport == "ipc" and pid > 0 and pid_start > 0 and process_start_time(pid) == pid_start:
            self.pid, self.pid_start = pid, pid_start
            return True
        return False

    def process_gone(self) -> bool:
        return self.pid > 0 and process_start_time(self.pid) != self.pid_start
