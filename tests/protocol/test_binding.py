"""The binding of keys to their namespace (``kvstore/binding.py``) and the session's key mapping around it."""

from __future__ import annotations

import os

from kvstore.binding import bind_key, bind_keys, bind_packed, namespace_mask, rebind
from kvstore.protocol.kv_events import block_hash
from kvstore.protocol.wire import Op
from kvstore.tenants.key_space import KeySpace, SessionKeys, scope_request

KEYS = [os.urandom(16) for _ in range(20)]


def test_a_key_binds_apart_in_two_namespaces_and_back_with_the_same_call():
    a, b = rebind("nsA", KEYS[0]), rebind("nsB", KEYS[0])
    assert len({a, b, KEYS[0]}) == 3
    assert rebind("nsA", a) == KEYS[0]   # its own inverse: what records keep is the key as sent


def test_the_event_name_of_a_key_does_not_move():
    assert block_hash(rebind("nsA", KEYS[0])) == block_hash(KEYS[0])
    assert rebind("nsA", KEYS[0])[8:] == KEYS[0][8:]


def test_lists_packed_and_single_keys_bind_alike():
    mask = namespace_mask("ns")
    one = [bind_key(mask, k) for k in KEYS]
    assert bind_keys(mask, KEYS) == one and bind_keys(mask, KEYS[:3]) == one[:3]
    assert bind_packed(mask, b"".join(KEYS)) == b"".join(one)
    assert bind_packed(mask, b"") == b""
    assert bind_key(mask, b"short") == b"short"   # left for the parser to refuse


def test_a_session_maps_through_its_tenants_space_then_its_namespace():
    space = KeySpace(b"s" * 32, "t")
    keys = SessionKeys("ns", space)
    assert keys.scope_key(KEYS[0]) == rebind("ns", space.scope_key(KEYS[0]))
    assert keys.scope(KEYS) == [rebind("ns", space.scope_key(k)) for k in KEYS]
    assert keys.scope_packed(b"".join(KEYS)) == b"".join(keys.scope(KEYS))
    open_keys = SessionKeys("ns", None)
    header = scope_request(open_keys, Op.LOOKUP, {"op": Op.LOOKUP, "keys": b"".join(KEYS[:2])})
    assert header["keys"] == rebind("ns", KEYS[0]) + rebind("ns", KEYS[1])
    assert scope_request(open_keys, Op.STATS, {"op": Op.STATS}) == {"op": Op.STATS}
