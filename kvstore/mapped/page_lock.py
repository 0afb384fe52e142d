"""Page-locking the shared host arena (``cudaHostRegister``; "pin" in kvstore means a lease, never this) with CUDA,
so host↔GPU copies are asynchronous DMA at PCIe speed.

``cudaHostRegister`` pins existing pages (our arena is an mmap of a /dev/shm file, so it cannot come from
``cudaHostAlloc``) and makes them visible to every CUDA context (``cudaHostRegisterPortable``). The daemon
registers the arena once at start and each engine registers its own mapping once at connect.

Pinning needs locked-memory allowance where the kernel accounts it: ``RLIMIT_MEMLOCK`` (``ulimit -l``) of at
least the arena's size, or ``unlimited`` (``LimitMEMLOCK=infinity`` in a systemd unit, ``--ulimit memlock=-1``
in Docker). Pinning is an optimisation, never a requirement: when CUDA is absent, or the registration fails
(too low a limit, or the driver refuses), the region stays pageable, a ``host_pin_failed`` line is logged with
the limit and the fix, and everything works at pageable-copy speed.
"""

from __future__ import annotations

import ctypes
import resource
import time
from dataclasses import dataclass
from typing import Any

from .. import logs
from ..units import format_size

HOST_REGISTER_PORTABLE = 1
HOST_REGISTER_READ_ONLY = 8   # cudaHostRegisterReadOnly: needed for a mapping the CPU may only read


@dataclass
class PageLockedRegion:
    """A host range and whether CUDA has it page-locked (``reason`` says why not)."""

    address: int
    nbytes: int
    locked: bool
    reason: str = ""

    def unlock(self) -> None:
        """Unregister before the memory is unmapped (a no-op when it was never page-locked)."""
        if not self.locked:
            return
        import torch

        torch.cuda.cudart().cudaHostUnregister(self.address)
        self.locked = False


def memlock_limit() -> int | None:
    """The soft RLIMIT_MEMLOCK in bytes, or None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def buffer_address(buf: Any) -> int:
    """Address of a buffer (mmap, bytearray, memoryview; writable or not) without keeping an export on it."""
    if memoryview(buf).readonly:
        import numpy as np

        return int(np.frombuffer(buf, dtype=np.uint8, count=1).ctypes.data)
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))   # the temporary export ends with the expression


def _error_code(result: Any) -> int:
    return int(getattr(result, "value", result))


def page_lock(buf: Any, nbytes: int, who: str = "daemon", read_only: bool = False) -> PageLockedRegion:
    """Page-lock ``nbytes`` of ``buf`` with CUDA, or explain (and log) why it stays pageable. ``read_only``: a
    mapping without write permission (registered read-only: the device only copies out of it)."""
    address = buffer_address(buf)
    limit = memlock_limit()
    limit_text = "unlimited" if limit is None else format_size(limit)
    try:
        import torch

        if not torch.cuda.is_available():
            return PageLockedRegion(address, nbytes, False, "no CUDA device is visible")
        start = time.monotonic()
        code = _error_code(torch.cuda.cudart().cudaHostRegister(
            address, nbytes, HOST_REGISTER_PORTABLE | (HOST_REGISTER_READ_ONLY if read_only else 0)))
    except Exception as exc:  # noqa: BLE001 - any failure to page-lock means "stay pageable"
        code, start = -1, time.monotonic()
        reason = f"cudaHostRegister raised {exc!r}"
    else:
        reason = f"cudaHostRegister returned cudaError {code}"
    if code == 0:
        logs.info("host_pinned", who=who, bytes=nbytes, seconds=round(time.monotonic() - start, 3),
                  memlock=limit_text)
        return PageLockedRegion(address, nbytes, True)
    hint = ("raise the locked-memory limit to at least the host tier size (ulimit -l unlimited, "
            "LimitMEMLOCK=infinity, docker --ulimit memlock=-1)") if limit is not None and limit < nbytes else ""
    logs.warning("host_pin_failed", who=who, bytes=nbytes, reason=reason, memlock=limit_text,
                 fallback="pageable copies (slower, synchronous)", fix=hint or "none needed")
    return PageLockedRegion(address, nbytes, False, reason)
