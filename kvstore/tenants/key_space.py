"""Per-tenant key spaces: the keys a restricted tenant's chunks are stored under are not the keys its clients send.

Why. Chunk keys are chained from the namespace (``keys.py``), so anyone who knows a namespace and guesses a prompt
computes its keys. With one key space for all, such a client could learn that another tenant holds a key (a put
of it answers "already stored") and fetch another tenant's chunk from a shared remote store (records are named by
key). The access checks (``access.py``) hide a chunk the Store knows the owner of; they cannot hide a key the
Store does not hold yet (a remote record) nor make a held key absent for a put.

How. The daemon keeps one secret (``key_file.py``). The key space of a restricted tenant T maps a client's key k to
``blake2b(k, key=K_T, digest_size=16)``, with ``K_T = blake2b(T, key=SECRET, person=PERSON)``: keyed, so nobody
without the secret can name a key of T's space, and 128 bits wide like the keys themselves, so T's chains stay
chains. Every layer below the dispatcher (index, tiers, disk files, the remote store, the kept arena) sees only
these scoped keys. Open namespaces (no tenants table, tenants without identities, the default tenant unless it
lists identities) keep their raw keys, so the shared-memory index, which lists open namespaces only, still
answers the keys its readers compute.

Where. One place: the dispatcher hands every request of a session to its handler through ``scope_request``,
which rewrites the key fields of the header (``KEY_FIELDS``: one entry per operation, checked complete at import,
so a new operation must say whether it carries keys). A field that is not well formed is left as it is, so the
message parser refuses it with its own line. The session's space is chosen at hello and again when the tenants
table in force changes (``Service.key_space``).

Cost. One copy of a keyed BLAKE2b state, one update and one digest per key of a restricted session's request;
nothing for an open one.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from ..binding import NamespaceBinding
from ..keys import KEY_BYTES
from ..protocol.wire import MAX_BATCH, Op
from .table import TenantTable

PERSON = b"kvstore-tenant"   # BLAKE2b personalisation of the per-tenant key (at most 16 bytes)
SECRET_BYTES = 32            # the daemon's secret (BLAKE2b takes keys of up to 64 bytes)

# The header fields of each operation that carry chunk keys: a key, a list of keys, or keys packed in one bin
# (``protocol/fields.py`` read_keys / read_optional_key; LOOKUP_SEEN's fields are lists of packed chains).
KEY_FIELDS: dict[Op, tuple[str, ...]] = {
    Op.LOOKUP: ("keys",),
    Op.RESERVE: ("keys", "parent"),
    Op.PUT_INLINE: ("keys", "parent"),
    Op.CREDIT_PUT: ("keys", "parent"),
    Op.GET: ("keys",),
    Op.DELETE: ("keys",),
    Op.CORRUPT: ("keys",),
    Op.VERIFY: ("keys",),
    Op.LOOKUP_SEEN: ("found", "read"),
}
NO_KEYS = frozenset({Op.HELLO, Op.PING, Op.COMMIT, Op.ABORT, Op.RELEASE, Op.EXTEND, Op.STATS, Op.CLEAR,
                     Op.SCRUB, Op.SCRUB_START, Op.SCRUB_STATUS, Op.SCRUB_CANCEL, Op.RELOAD, Op.LOAD_TIMES,
                     Op.INVALIDATE})
assert set(KEY_FIELDS) | NO_KEYS == set(Op) and not set(KEY_FIELDS) & NO_KEYS, \
    "every operation must say whether it carries keys (tenants/key_space.py)"


class KeySpace:
    """One restricted tenant's key space: a keyed, one-way map of client keys to the keys its chunks are kept
    under. Equal inputs give equal keys in every daemon that holds the same secret."""

    __slots__ = ("_base", "tenant")

    def __init__(self, secret: bytes, tenant: str) -> None:
        """Args:
            secret: the daemon's ``SECRET_BYTES`` secret (``key_file.py``).
            tenant: the tenant's name, as the config file gives it.
        Raises:
            ValueError: the secret is not ``SECRET_BYTES`` long.
        """
        if len(secret) != SECRET_BYTES:
            raise ValueError(f"a tenant key secret is {SECRET_BYTES} bytes, not {len(secret)}")
        self.tenant = tenant
        tenant_key = hashlib.blake2b(tenant.encode(), key=secret, person=PERSON).digest()
        self._base = hashlib.blake2b(key=tenant_key, digest_size=KEY_BYTES)

    def scope_key(self, key: bytes) -> bytes:
        """The key ``key`` names in this space."""
        h = self._base.copy()
        h.update(key)
        return h.digest()

    def scope(self, keys: Sequence[bytes]) -> list[bytes]:
        """The keys ``keys`` name in this space, in order."""
        return [self.scope_key(k) for k in keys]

    def scope_packed(self, packed: bytes) -> bytes:
        """``packed`` (keys of ``KEY_BYTES`` back to back) with every key scoped, packed the same way."""
        return b"".join(self.scope_key(packed[i:i + KEY_BYTES]) for i in range(0, len(packed), KEY_BYTES))

    def __repr__(self) -> str:
        return f"KeySpace(tenant={self.tenant!r})"   # never the secret


class TenantKeys:
    """The daemon's secret and the key spaces of restricted tenants, made once per tenant name (a space depends on
    the name and the secret only, so it outlives a reload of the table)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) != SECRET_BYTES:
            raise ValueError(f"a tenant key secret is {SECRET_BYTES} bytes, not {len(secret)}")
        self._secret = secret
        self._spaces: dict[str, KeySpace] = {}

    def space(self, tenant: str) -> KeySpace:
        """Tenant ``tenant``'s key space."""
        space = self._spaces.get(tenant)
        if space is None:
            space = self._spaces[tenant] = KeySpace(self._secret, tenant)
        return space

    def space_for(self, table: TenantTable | None, namespace: str) -> KeySpace | None:
        """The key space of ``namespace`` under ``table``: its tenant's when that tenant is restricted, else None
        (raw keys)."""
        if table is None:
            return None
        tenant = table.tenant_for(namespace)
        return self.space(tenant.name) if tenant.restricted else None

    def __repr__(self) -> str:
        return f"TenantKeys(spaces={sorted(self._spaces)})"   # never the secret


class SessionKeys:
    """What a session's keys are mapped through: its tenant's key space when the tenant is restricted, then its
    namespace's binding (``binding.py``). Every session has one, so every key below the dispatcher is bound."""

    __slots__ = ("binding", "space")

    def __init__(self, namespace: str, space: KeySpace | None) -> None:
        self.space = space
        self.binding = NamespaceBinding(namespace)

    def scope_key(self, key: bytes) -> bytes:
        return self.binding.scope_key(self.space.scope_key(key) if self.space is not None else key)

    def scope(self, keys: Sequence[bytes]) -> list[bytes]:
        return self.binding.scope(self.space.scope(keys) if self.space is not None else keys)

    def scope_packed(self, packed: bytes) -> bytes:
        return self.binding.scope_packed(self.space.scope_packed(packed) if self.space is not None else packed)

    def __repr__(self) -> str:
        return f"SessionKeys({self.binding!r}, {self.space!r})"


def needs_key_spaces(table: TenantTable | None) -> bool:
    """Whether ``table`` has a restricted tenant (only then is a secret needed)."""
    return table is not None and any(t.restricted for t in table.all())


def scope_request(space: KeySpace | SessionKeys | None, op: Op, header: dict[str, Any]) -> dict[str, Any]:
    """``header`` with the keys of every key field of ``op`` mapped into ``space`` (a copy; the header itself when
    ``space`` is None or ``op`` carries no keys). Fields that are absent or not well formed stay as they are, for
    the operation's parser to refuse."""
    fields = KEY_FIELDS.get(op)
    if space is None or fields is None:
        return header
    scoped = dict(header)
    for name in fields:
        if name in header:
            scoped[name] = _scope_value(space, header[name], op is Op.LOOKUP_SEEN)
    return scoped


def _scope_value(space: KeySpace | SessionKeys, value: Any, chains: bool) -> Any:
    """A key field's value scoped: a key or packed keys (bin), a list of keys, or (``chains``) a list of packed
    chains. Anything else is returned unchanged."""
    if isinstance(value, bytes):
        return _scope_bin(space, value)
    if not isinstance(value, list) or len(value) > 2 * MAX_BATCH:
        return value
    if chains:
        return [_scope_bin(space, v) if isinstance(v, bytes) else v for v in value]
    if all(type(k) is bytes and len(k) == KEY_BYTES for k in value):
        return space.scope(value)
    return value


def _scope_bin(space: KeySpace | SessionKeys, value: bytes) -> bytes:
    if not value or len(value) % KEY_BYTES or len(value) // KEY_BYTES > MAX_BATCH:
        return value
    return space.scope_packed(value)
