"""Turning what callers hand us (bytes, memoryviews, numpy arrays, torch tensors on any device) into bytes.

torch is imported only when a tensor is actually passed, so clients that move plain buffers never pay for it.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..errors import UsageError


def _is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "element_size")


# What a refused buffer is, after "CALL: NAME[i]: " (``client/arguments.each`` names the call, argument and index)
NOT_CONTIGUOUS = ("not C-contiguous (a strided slice or a transposed array?); pass a contiguous copy "
                  "(bytes(...), numpy.ascontiguousarray(...))")
EMPTY = "empty (0 bytes); every chunk stored holds at least one byte"


def nbytes_of(buf: Any) -> int:
    if _is_tensor(buf):
        return buf.numel() * buf.element_size()
    return memoryview(buf).nbytes


def stored_size(buf: Any) -> int:
    """The bytes ``put`` stores of ``buf`` (copied into the arena later): a tensor (made contiguous as it is copied)
    or a C-contiguous buffer, not empty. Raises UsageError (or TypeError for what is no buffer at all)."""
    if _is_tensor(buf):
        size = buf.numel() * buf.element_size()
    else:
        view = memoryview(buf)
        if not view.c_contiguous:
            raise UsageError(NOT_CONTIGUOUS)
        size = view.nbytes
    if not size:
        raise UsageError(EMPTY)
    return size


def stored_bytes(buf: Any) -> Any:
    """``as_host_bytes`` of a buffer ``put`` sends in a frame; refuses an empty one as ``stored_size`` does."""
    flat = as_host_bytes(buf)
    if not flat.nbytes:
        raise UsageError(EMPTY)
    return flat


def _flat_bytes_view(buf: Any) -> memoryview:
    view = memoryview(buf)
    if not view.c_contiguous:
        raise UsageError(NOT_CONTIGUOUS)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def copy_into(dst: memoryview, buf: Any, gil_free: bool = False) -> None:
    """Copy ``buf`` into ``dst`` (exactly its size) with one memcpy (or one device-to-host copy); ``gil_free``:
    one that lets other threads run meanwhile (``copies.py``)."""
    if _is_tensor(buf):
        import torch

        src = buf.detach().reshape(-1).contiguous().view(torch.uint8)
        torch.frombuffer(dst, dtype=torch.uint8).copy_(src)
        return
    _copy_bytes(dst, _flat_bytes_view(buf), gil_free)


def as_host_bytes(buf: Any) -> Any:
    """Something ZeroMQ can send without another copy: a flat byte view of host memory."""
    if _is_tensor(buf):
        import torch

        return buf.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy()
    return _flat_bytes_view(buf)


def writable_bytes(dest: Any) -> Any:
    """A flat writable byte view of ``dest`` (a host buffer, or a tensor on any device: then the tensor itself)."""
    if _is_tensor(dest):
        return dest
    view = _flat_bytes_view(dest)
    if view.readonly:
        raise UsageError("destination buffers must be writable")
    return view


def copy_out(dest: Any, src: memoryview, gil_free: bool = False) -> None:
    """Copy ``src`` into the leading bytes of ``dest`` (from ``writable_bytes``) with one memcpy (or one
    host-to-device copy); ``gil_free`` as for ``copy_into``."""
    if type(dest) is memoryview:   # the common case first (``writable_bytes`` of a host buffer)
        _copy_bytes(dest[:len(src)], src, gil_free)
        return
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # ``src`` is read-only (a reader's view); it is only read
        source = torch.frombuffer(src, dtype=torch.uint8)
    dest.view(-1).view(torch.uint8)[:len(src)].copy_(source)


def _copy_bytes(dst: memoryview, src: memoryview, gil_free: bool) -> None:
    """One memcpy of ``src`` into ``dst`` (the same length). A memoryview copy holds the GIL; numpy's lets go of
    it (and costs two array headers more), which two threads copying at once need."""
    if gil_free:
        np.copyto(np.frombuffer(dst, dtype=np.uint8), np.frombuffer(src, dtype=np.uint8))
    else:
        dst[:] = src
