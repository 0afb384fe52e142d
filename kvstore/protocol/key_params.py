"""How a client makes its keys (chunk size, key scheme, hash seed): what ``server/requests/compat.py`` checks at
hello, and what every record of a chunk keeps so that the check outlives a restart (kept arena descriptions, the
journal, disk file headers)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

MAX_SCHEME_BYTES = 256
_PACKED = struct.Struct("<IQH")   # chunk_tokens, hash_seed, scheme length; then the scheme (UTF-8)


@dataclass(frozen=True)
class KeyParams:
    chunk_tokens: int
    key_scheme: str
    hash_seed: int

    def differences(self, other: "KeyParams") -> list[str]:
        return [f"{name} {getattr(other, name)!r} (the daemon holds chunks made with {getattr(self, name)!r})"
                for name in ("chunk_tokens", "key_scheme", "hash_seed") if getattr(self, name) != getattr(other, name)]

    def record(self) -> list[Any]:
        """As a description's or the journal's chunk record carries it."""
        return [self.chunk_tokens, self.key_scheme, self.hash_seed]

    def packed(self) -> bytes:
        """As a disk file's header carries it (``tiers/disk/format.py``)."""
        scheme = self.key_scheme.encode()[:MAX_SCHEME_BYTES]
        return _PACKED.pack(self.chunk_tokens, self.hash_seed, len(scheme)) + scheme


def params_from_record(item: Any) -> KeyParams | None:
    """The parameters ``KeyParams.record`` made ``item`` from; None when it is absent or malformed (a record that
    cannot say is never guessed at: the namespace is then checked as one nothing is known of)."""
    if not isinstance(item, (list, tuple)) or len(item) != 3:
        return None
    chunk_tokens, scheme, seed = item
    if type(chunk_tokens) is not int or chunk_tokens <= 0 or not isinstance(scheme, str) or type(seed) is not int \
            or not 0 <= seed < 1 << 64 or chunk_tokens >= 1 << 32:
        return None
    return KeyParams(chunk_tokens, scheme, seed)


def params_from_packed(data: bytes, at: int) -> tuple[KeyParams, int] | None:
    """The parameters ``KeyParams.packed`` wrote at ``at`` of ``data`` and where they end; None when they run past
    ``data`` or do not decode."""
    if at + _PACKED.size > len(data):
        return None
    chunk_tokens, seed, length = _PACKED.unpack_from(data, at)
    end = at + _PACKED.size + length
    if end > len(data) or chunk_tokens == 0:
        return None
    try:
        scheme = bytes(data[at + _PACKED.size:end]).decode()
    except UnicodeDecodeError:
        return None
    return KeyParams(chunk_tokens, scheme, seed), end
