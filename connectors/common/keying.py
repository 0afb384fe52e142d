"""What a connector folds into a request's chunk keys beyond its token ids, whatever the engine: the
canonical encoding of extra keys, the adapters' content fingerprints, the weights epoch, and the refusal of an
input that cannot be keyed (`Unkeyable`). The engine's own part is in its connector (``vllm/identity.py``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.errors import ConfigError, UsageError

from .fingerprint import ADAPTER_CONFIGS, weights_fingerprint

WEIGHTS_VERSION_PARAM = "kvstore_weights_version"   # a request's kv_transfer_params key naming its weights


class Unkeyable(UsageError):
    """A request input the connector cannot fold into its keys; ``kind`` names it for the counters (it never
    leaves the connector: the request is neither loaded nor saved)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass
class RequestKeys:
    """A request's key root and per-chunk extras (as far as they were made: `extend` makes more)."""

    root: str
    extras: list[bytes] = field(default_factory=list)
    next_mm: int = 0          # vLLM's multimodal cursor after the last chunk made

    def upto(self, chunks: int) -> list[bytes]:
        """The extras of chunks ``0 .. chunks`` with trailing empty ones left off (plain chunks fold nothing)."""
        extras = self.extras[:chunks]
        while extras and not extras[-1]:
            extras.pop()
        return extras


class WeightsEpoch:
    """Which weights the engine's KV is computed with, beyond the checkpoint's fingerprint.

    Starts at the configured ``weights_version`` (empty: the checkpoint's weights as loaded). ``reset()`` (the
    connector's ``reset_cache()``, after an in-place weight update) moves it to a value no engine has used, so no
    chunk saved before is found after, and none is deleted. A request that names its weights version
    (``kv_transfer_params`` ``kvstore_weights_version``) is keyed by that version instead: engines given the same
    new weights by the same trainer step share their chunks again."""

    def __init__(self, configured: str) -> None:
        self.current = configured

    def reset(self) -> None:
        self.current = f"reset-{uuid.uuid4().hex}"

    def of(self, request: Any) -> str:
        params = getattr(request, "kv_transfer_params", None)
        named = params.get(WEIGHTS_VERSION_PARAM) if isinstance(params, dict) else None
        if named is None:
            return self.current
        if not isinstance(named, str) or not named:
            raise Unkeyable("weights_version", f"{WEIGHTS_VERSION_PARAM} must be a non-empty string, not {named!r}")
        return f"named-{named}"


class AdapterFingerprints:
    """The content fingerprints of LoRA adapters, remembered per adapter directory while its files are
    unchanged (their sizes, times and inodes: an adapter rewritten in place is hashed again)."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[tuple[Any, ...], str]] = {}

    def of(self, lora_request: Any) -> str:
        path = getattr(lora_request, "lora_path", None) or getattr(lora_request, "path", None)
        if not path or not Path(path).exists():
            raise Unkeyable("lora", f"adapter {getattr(lora_request, 'lora_name', '?')!r} has no readable "
                                    f"files at {path!r}")
        try:
            stamp = _stamp(Path(path))
            known = self._known.get(str(path))
            if known is not None and known[0] == stamp:
                return known[1]
            digest = weights_fingerprint(path, "full", also=ADAPTER_CONFIGS).digest
        except (OSError, ConfigError) as exc:
            raise Unkeyable("lora", str(exc)) from None
        self._known[str(path)] = (stamp, digest)
        return digest


def _stamp(path: Path) -> tuple[Any, ...]:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return tuple((str(p), s.st_size, s.st_mtime_ns, s.st_ino) for p in files for s in [p.stat()])


def encode(value: Any) -> bytes:
    """A canonical byte string of an extra key (nested tuples of strings, bytes, integers, floats, booleans,
    None): the same value gives the same bytes in any process.

    Raises:
        Unkeyable: a value of another type.
    """
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"T" if value else b"F"
    if isinstance(value, int):
        return b"i" + str(value).encode() + b";"
    if isinstance(value, float):
        return b"f" + value.hex().encode() + b";"
    if isinstance(value, str):
        raw = value.encode()
        return b"s" + str(len(raw)).encode() + b":" + raw
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        return b"b" + str(len(raw)).encode() + b":" + raw
    if isinstance(value, (tuple, list)):
        return b"(" + b"".join(encode(v) for v in value) + b")"
    raise Unkeyable("extra_keys", f"an extra key of type {type(value).__name__}")
