"""What a model's (or an adapter's) KV depends on beyond its name: a fingerprint of its weights' bytes, and a
digest of the settings that change KV values at the same shape and dtype.

Weights. A checkpoint directory's weight files are hashed with xxh3-128, each under its name and size. A
safetensors file is read the way it is laid out: its whole header (every tensor's name, dtype, shape and
offsets) and, of every tensor, `WINDOWS` windows of `WINDOW` bytes spread evenly over its data, first and
last byte included (a tensor no larger than those windows is read whole). So identical bytes give the same
fingerprint on every host (nothing of the path, the host or the file times goes in), a tensor rewritten with
new values changes it, and the cost is a few reads per tensor rather than the checkpoint's size: the
fingerprint of a multi-GB checkpoint is read in well under a second (``python -m bench.fingerprint``). Its
limit: a change confined to bytes between the windows of one large tensor (a handful of edited values) is
not seen; ``mode="full"`` hashes every byte for whoever changes weights that way. Other weight formats
(``.bin``, ``.pt``, ``.pth``, ``.gguf``) are hashed whole: they have no header that says where a tensor lies.

Settings. `settings_digest` hashes a settings record (JSON with sorted keys): connectors pass what their
engine's config says of quantization, RoPE scaling, overrides and the KV cache dtype and scales.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
import xxhash

from kvstore.errors import ConfigError

WINDOWS = 8                 # windows read per tensor
WINDOW = 4096               # bytes per window
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
ADAPTER_CONFIGS = ("adapter_config.json",)   # the files beside an adapter's weights that shape its output
MODES = ("sampled", "full", "off")
_READ = 8 << 20             # bytes per read when a file is hashed whole
_MAX_HEADER = 100 << 20     # a safetensors header above this is not one
_BYTES = torch.uint8


@dataclass(frozen=True)
class Fingerprint:
    """A checkpoint's fingerprint (32 hex digits) and what it read: files, bytes hashed."""

    digest: str
    files: int
    bytes_read: int


def weights_fingerprint(path: str | os.PathLike[str], mode: str = "sampled",
                        also: Iterable[str] = ()) -> Fingerprint:
    """The fingerprint of the weight files under ``path`` (a directory, searched recursively, or one file).

    Args:
        path: the checkpoint directory or weight file.
        mode: "sampled" (safetensors by windows, see the module) or "full" (every byte of every file).
        also: names of further files hashed whole when present (an adapter's ``adapter_config.json``).
    Returns:
        The fingerprint.
    Raises:
        ConfigError: ``path`` holds no weight file, a file cannot be read, or a safetensors header is broken.
    """
    if mode not in ("sampled", "full"):
        raise ConfigError(f"kvstore fingerprint mode must be \"sampled\" or \"full\", not {mode!r}")
    root = Path(path)
    files = _weight_files(root)
    extra = [root / name for name in also if root.is_dir() and (root / name).is_file()]
    if not files:
        raise ConfigError(f"kvstore: no weight file ({', '.join(WEIGHT_SUFFIXES)}) under {root}: point the engine "
                          f"at a checkpoint directory, or set fingerprint \"off\" with a model_id that names "
                          f"the weights")
    h = xxhash.xxh3_128()
    total = 0
    for file in files + extra:
        name = file.relative_to(root).as_posix() if root.is_dir() else file.name
        size = file.stat().st_size
        h.update(f"{name}\0{size}\0".encode())
        try:
            if mode == "sampled" and file.suffix == ".safetensors":
                total += _hash_safetensors(file, h)
            else:
                total += _hash_whole(file, h)
        except OSError as exc:
            raise ConfigError(f"kvstore: cannot read {file} for the weights fingerprint: {exc}") from None
    return Fingerprint(h.hexdigest(), len(files) + len(extra), total)


def tensors_fingerprint(tensors: Iterable[tuple[str, Any]]) -> str:
    """The fingerprint (32 hex digits) of tensors in memory (a model's ``named_parameters()`` and buffers),
    read as a safetensors file is: each tensor's name, dtype and shape, and `WINDOWS` windows of `WINDOW` bytes
    spread over its data (all of it when small). A tensor on a GPU has only its windows copied to the host.

    Args:
        tensors: (name, torch.Tensor) pairs, in any order (they are sorted by name).
    Returns:
        The fingerprint.
    """
    h = xxhash.xxh3_128()
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        flat = tensor.detach().reshape(-1)
        raw = flat.view(_BYTES) if flat.dtype != _BYTES else flat
        h.update(f"{name}\0{flat.dtype}\0{tuple(tensor.shape)}\0".encode())
        for offset, count in _windows(0, raw.numel()):
            h.update(raw[offset:offset + count].cpu().numpy().tobytes())
    return h.hexdigest()


def settings_digest(settings: dict[str, Any]) -> str:
    """A digest (16 hex digits) of a settings record: the same values give the same digest anywhere."""
    text = json.dumps(settings, sort_keys=True, default=str, separators=(",", ":"))
    return xxhash.xxh3_64_hexdigest(text.encode())


def _weight_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file())


def _hash_whole(file: Path, h: Any) -> int:
    total = 0
    with open(file, "rb") as f:
        while block := f.read(_READ):
            h.update(block)
            total += len(block)
    return total


def _hash_safetensors(file: Path, h: Any) -> int:
    """Hash a safetensors file's header and windows of every tensor's data; returns the bytes read."""
    with open(file, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) != 8:
            raise ConfigError(f"kvstore: {file} is not a safetensors file (shorter than its header length)")
        (length,) = struct.unpack("<Q", head)
        if length > min(_MAX_HEADER, size - 8):
            raise ConfigError(f"kvstore: {file} is not a safetensors file (header length {length})")
        header = os.pread(fd, length, 8)
        h.update(header)
        try:
            table = json.loads(header)
        except ValueError:
            raise ConfigError(f"kvstore: {file} has a safetensors header that is not JSON") from None
        base, total = 8 + length, 8 + length
        spans = sorted(tuple(t["data_offsets"]) for name, t in table.items()
                       if name != "__metadata__" and isinstance(t, dict) and "data_offsets" in t)
        for start, end in spans:
            for offset, count in _windows(int(start), int(end)):
                block = os.pread(fd, count, base + offset)
                h.update(block)
                total += len(block)
    return total


def _windows(start: int, end: int) -> list[tuple[int, int]]:
    """(offset, length) of the windows read of a tensor's data ``start .. end``: all of it when small."""
    n = end - start
    if n <= WINDOWS * WINDOW:
        return [(start, n)] if n > 0 else []
    step = (n - WINDOW) / (WINDOWS - 1)
    return [(start + int(i * step), WINDOW) for i in range(WINDOWS)]
