"""Who a client is (its principal) and which namespaces it may touch.

A local client is known by the uid/gid the kernel reports for its Unix socket (``SO_PEERCRED``), a remote one by
its CURVE public key. A namespace owned by a tenant that lists identities may be read, written, deleted or
cleared only by a principal that tenant lists; every other namespace is open to whoever reaches the socket, so
a host without identities in its tenant table behaves as before.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Callable

from .table import Tenant, TenantTable

_UCRED = struct.Struct("3i")    # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Principal:
    """Who sent a request: a local user (``uid``/``gid``) or a remote CURVE key; unknown fields are ``None``."""

    uid: int | None = None
    gid: int | None = None
    curve_key: str | None = None


def peer_principal(sock: socket.socket) -> Principal:
    """The principal of the process at the other end of a connected Unix socket.

    Args:
        sock: a connected ``AF_UNIX`` socket.
    Returns:
        its uid and gid as the kernel saw them at ``connect``.
    Raises:
        OSError: the socket is not a connected Unix socket.
    """
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    _pid, uid, gid = _UCRED.unpack(raw)
    return Principal(uid=uid, gid=gid)


def is_member(tenant: Tenant, who: Principal) -> bool:
    """Whether ``who`` is one of the identities ``tenant`` lists."""
    return ((who.uid is not None and who.uid in tenant.uids)
            or (who.gid is not None and who.gid in tenant.gids)
            or (who.curve_key is not None and who.curve_key in tenant.curve_keys))


def may_access(table: TenantTable, who: Principal, namespace: str) -> bool:
    """Whether ``who`` may read, write, delete or clear ``namespace`` (open unless its tenant lists identities)."""
    tenant = table.tenant_for(namespace)
    return not tenant.restricted or is_member(tenant, who)


class AccessCache:
    """Which namespaces one principal may read under one table, remembered: each check after a namespace's first
    is one dict lookup whatever the answer, so that checking a chunk the principal may not read costs what
    checking its own namespace for an absent chunk costs (``may_access`` itself does more work for a restricted
    tenant's namespace than for an open one). Bounded: cleared when it holds ``LIMIT`` namespaces."""

    LIMIT = 4096

    def __init__(self, table: TenantTable, who: Principal) -> None:
        self.table = table
        self.who = who
        self._seen: dict[str, bool] = {}

    def __call__(self, namespace: str) -> bool:
        seen = self._seen.get(namespace)
        if seen is None:
            if len(self._seen) >= self.LIMIT:
                self._seen.clear()
            seen = self._seen[namespace] = may_access(self.table, self.who, namespace)
        return seen


def private_namespaces(tenants: TenantTable | None) -> Callable[[str], bool] | None:
    """Whether a namespace is a restricted tenant's, kept out of the shared index (any local reader could map it);
    None without a tenants table."""
    if tenants is None:
        return None
    return lambda namespace: tenants.tenant_for(namespace).restricted
