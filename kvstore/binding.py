"""Keys bound to their namespace: the key the daemon keeps a chunk under, in every tier, is a function of the
namespace its client said hello in and the key the client sent.

Why. A client names chunks by keys it computes (``keys.py`` chains them from the namespace, but nothing obliges a
client to use that chain). Without a binding, a client of namespace ``nsB`` that sends ``nsA``'s keys stores
chunks ``nsA`` then reads, and ``nsA``'s own put of the right bytes is answered "already stored".

How. ``bind(ns, k) = (lo(k) XOR mask(ns)) ‖ hi(k)``: the key's first 8 bytes (its low half read little-endian,
the half the shared index probes from) XORed with a 64-bit mask of the namespace, its last 8 bytes unchanged.

* Injective per namespace and across them: two namespaces' masks differ, so the same client key in two
  namespaces gives two stored keys, and keys a chain gives (uniform 128-bit values) never meet another
  namespace's but with the chance of any two chain keys meeting.
* Free where it matters: a reader of the shared index (``mapped/index_reader.py``, the C walk in
  ``native/kvstore_index.c``) binds each key with one XOR while it walks, so a lookup costs what it did.
* Event names do not move: a chunk saved without engine block names is published under its key's last 8 bytes
  (``protocol/kv_events.block_hash``), which the binding leaves as the client computed them.
* Not a credential. The mask is public, so a client can compute the key another namespace's chunk is kept
  under and send the key that binds to it in its own namespace; it could as well say hello in that namespace,
  which for an open namespace anyone may. What keeps a hostile local user out is the tenants table: a
  restricted tenant's namespaces need its identities at hello, and its keys are first mapped through its keyed
  space (``tenants/key_space.py``, a secret nobody else holds), so no other client can name any key of it.

Where. The dispatcher maps every key field of every request (``tenants/key_space.KEY_FIELDS``) through the
session's ``KeyBinding`` (the tenant's key space first, then the namespace); everything below it — the index,
the shared index, disk files, the remote store's object names, kept arenas and the journal — sees bound keys.
What the daemon writes down keeps the key as its client sent it (after its tenant's key space) beside the
namespace, and binds it again when it reads it (``rebind``: the binding is its own inverse): a disk file's
header, a kept arena's description, the journal. So records written before keys were bound read as those written
since, a daemon from before the binding reads what this one wrote, and a disk file is named by its bound key
(a file from before, named by the key as sent, is renamed at the index rebuild).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
import xxhash

KEY_BYTES = 16
BINDING_SCHEME = "ns-xor64/v1"


@lru_cache(maxsize=4096)
def namespace_mask(namespace: str) -> int:
    """The 64-bit mask of ``namespace`` (xxh3-64 of its UTF-8 name under a fixed label)."""
    return xxhash.xxh3_64_intdigest(b"kvstore:namespace-binding:" + namespace.encode(errors="surrogatepass"))


def bind_key(mask: int, key: bytes) -> bytes:
    """``key`` bound by ``mask`` (a key of another length is returned as it is, for the parser to refuse)."""
    if len(key) != KEY_BYTES:
        return key
    return (int.from_bytes(key[:8], "little") ^ mask).to_bytes(8, "little") + key[8:]


def rebind(namespace: str, key: bytes) -> bytes:
    """``key`` bound to ``namespace`` — and, since the binding is its own inverse, a bound key unbound: what the
    records the daemon writes (disk headers, kept arena descriptions, the journal) hold is the key as its client
    sent it, beside the namespace, so that records from before the binding and after it read the same way."""
    return bind_key(namespace_mask(namespace), key)


def bind_packed(mask: int, packed: bytes) -> bytes:
    """``packed`` (keys of ``KEY_BYTES`` end to end) with every key bound by ``mask``."""
    if not packed:
        return packed
    words = np.frombuffer(packed, dtype="<u8").copy()
    words[0::2] ^= np.uint64(mask)
    return words.tobytes()


def bind_keys(mask: int, keys: Sequence[bytes]) -> list[bytes]:
    """``keys`` (each of ``KEY_BYTES``) bound by ``mask``, in order."""
    if len(keys) < 8:
        return [bind_key(mask, k) for k in keys]
    packed = bind_packed(mask, b"".join(keys))
    return [packed[i:i + KEY_BYTES] for i in range(0, len(packed), KEY_BYTES)]


class NamespaceBinding:
    """One namespace's binding: the keys its sessions send mapped to the keys its chunks are kept under."""

    __slots__ = ("mask", "namespace")

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.mask = namespace_mask(namespace)

    def scope_key(self, key: bytes) -> bytes:
        return bind_key(self.mask, key)

    def scope(self, keys: Sequence[bytes]) -> list[bytes]:
        return bind_keys(self.mask, keys)

    def scope_packed(self, packed: bytes) -> bytes:
        return bind_packed(self.mask, packed)

    def __repr__(self) -> str:
        return f"NamespaceBinding({self.namespace!r})"
