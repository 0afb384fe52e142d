"""Key spaces in process: the map of a restricted tenant's keys, the one rewrite of a request's key fields, and
the tenant key file's checks (``kvstore/tenants/key_space.py``, ``key_file.py``)."""

from __future__ import annotations

import hashlib
import re
import os
import stat

import pytest

from kvstore.errors import ConfigError, KVStoreError
from kvstore.protocol.fields import read_optional_key
from kvstore.protocol.messages import Lookup, LookupSeen, Reserve
from kvstore.protocol.wire import MAX_BATCH, Op
from kvstore.tenants.key_file import read_or_create_secret
from kvstore.tenants.key_space import KEY_FIELDS, NO_KEYS, KeySpace, TenantKeys, needs_key_spaces, scope_request
from kvstore.tenants.table import parse_tenants

SECRET = bytes(range(32))
KEYS = [hashlib.blake2b(bytes([i]), digest_size=16).digest() for i in range(4)]
TABLE = {"team": {"namespaces": ["team:"], "uids": [4242]}, "open": {"namespaces": ["open:"]}}


def test_a_space_is_keyed_one_to_one_and_the_same_for_the_same_secret_and_tenant():
    space = KeySpace(SECRET, "team")
    scoped = space.scope(KEYS)
    assert all(len(k) == 16 for k in scoped) and len(set(scoped)) == len(KEYS)
    assert not set(scoped) & set(KEYS)                                   # no raw key names a scoped one
    assert KeySpace(SECRET, "team").scope(KEYS) == scoped                # another daemon, the same file
    assert KeySpace(SECRET, "other").scope(KEYS) != scoped               # another tenant, another space
    assert KeySpace(bytes(32), "team").scope(KEYS) != scoped             # another secret, another space
    assert space.scope_packed(b"".join(KEYS)) == b"".join(scoped)
    assert "team" in repr(space) and SECRET.hex() not in repr(space)
    with pytest.raises(ValueError, match="32 bytes, not 31"):
        KeySpace(SECRET[:31], "team")


def test_only_restricted_tenants_namespaces_get_a_space():
    table = parse_tenants(TABLE)
    keys = TenantKeys(SECRET)
    assert keys.space_for(table, "team:a") is keys.space_for(table, "team:b") is keys.space("team")
    assert keys.space_for(table, "open:a") is None and keys.space_for(table, "anything") is None
    assert keys.space_for(None, "team:a") is None
    assert needs_key_spaces(table) and not needs_key_spaces(parse_tenants({"open": TABLE["open"]}))
    assert not needs_key_spaces(None)


def test_every_operation_says_whether_it_carries_keys():
    assert set(KEY_FIELDS) | NO_KEYS == set(Op)


@pytest.mark.parametrize("packed", [True, False])
def test_a_request_s_keys_and_parent_are_scoped_and_parse_as_before(packed):
    space = KeySpace(SECRET, "team")
    keys = b"".join(KEYS) if packed else list(KEYS)
    header = {"op": int(Op.RESERVE), "id": 7, "keys": keys, "sizes": [4096] * 4, "parent": KEYS[0]}
    scoped = scope_request(space, Op.RESERVE, header)
    req = Reserve.parse(scoped, 1 << 20)
    assert req.keys == space.scope(KEYS) and req.parent == space.scope_key(KEYS[0])
    assert header["keys"] == keys and header["parent"] == KEYS[0]      # the received header is left as it was
    assert scope_request(None, Op.RESERVE, header) is header            # open namespaces: raw keys, no copy
    assert scope_request(space, Op.PING, {"op": 2, "id": 1}) == {"op": 2, "id": 1}
    assert read_optional_key(scope_request(space, Op.RESERVE, {"parent": None}), "parent") is None


def test_lookup_seen_chains_are_scoped():
    space = KeySpace(SECRET, "team")
    header = {"asked": [4, 2], "found": [b"".join(KEYS), b""], "read": [b"".join(KEYS[:2])]}
    note = LookupSeen.parse(scope_request(space, Op.LOOKUP_SEEN, header))
    assert note.found == [space.scope(KEYS), []] and note.read == [space.scope(KEYS[:2])]


@pytest.mark.parametrize("bad, message", [
    ([b"short"], "keys[0] must be a 16-byte binary key"),
    (b"x" * 17, "packs keys of 16 bytes; 17 bytes is not a multiple"),
    (b"k" * 16 * (MAX_BATCH + 1), f"the limit per request is {MAX_BATCH}"),
    ("text", "must be a list of 16-byte keys"),
])
def test_a_malformed_field_is_left_for_the_parser_to_refuse(bad, message):
    header = {"keys": bad}
    scoped = scope_request(KeySpace(SECRET, "team"), Op.LOOKUP, header)
    assert scoped["keys"] is bad
    with pytest.raises(KVStoreError, match=re.escape(message)):
        Lookup.parse(scoped)


def test_the_key_file_is_made_once_private_and_read_back(tmp_path):
    path = str(tmp_path / "deeper" / "tenant-keys.secret")
    secret = read_or_create_secret(path)
    assert len(secret) == 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert read_or_create_secret(path) == secret


def _bad_size(path: str) -> None:
    with open(path, "wb") as f:
        f.write(b"x" * 31)
    os.chmod(path, 0o600)


def _open_to_group(path: str) -> None:
    read_or_create_secret(path)
    os.chmod(path, 0o640)


def _link(path: str) -> None:
    target = path + ".real"
    read_or_create_secret(target)
    os.symlink(target, path)


def _directory(path: str) -> None:
    os.mkdir(path, 0o700)


def _not_ours(path: str) -> None:
    read_or_create_secret(path)
    os.chown(path, os.geteuid() + 1, -1)


@pytest.mark.parametrize("spoil, message", [
    (_bad_size, "holds 31 bytes, not 32: it is not a tenant key file; restore the right one"),
    (_open_to_group, "is open to group or others (mode 0640); it holds the tenants' key secret: chmod 600"),
    (_link, ": it is a symbolic link; give --tenant-key-file a path"),
    (_directory, "is not a regular file"),
    pytest.param(_not_ours, ", not by the daemon's user (uid 0); chown it to that user",
                 marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")),
])
def test_a_key_file_the_daemon_cannot_trust_is_refused_in_one_line(tmp_path, spoil, message):
    path = str(tmp_path / "tenant-keys.secret")
    spoil(path)
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        read_or_create_secret(path)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("--tenant-key-file: ") and path in line
