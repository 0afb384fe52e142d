"""Mooncake Store backend, through its Python client (``mooncake.store``).

URL: ``mooncake://MASTER_HOST:PORT?metadata=URL`` with optional parameters

* ``metadata``: the transfer-engine metadata server, e.g. the master's
  built-in one ``http://HOST:8080/metadata`` (started with
  ``--enable_http_metadata_server``), ``etcd://...`` or ``P2PHANDSHAKE``.
  Default: ``http://MASTER_HOST:8080/metadata``.
* ``local_hostname``: the address this client advertises. Default: 127.0.0.1
  when the master is on loopback, else the local address that routes to it.
* ``protocol`` (``tcp``), ``device`` (RDMA device names, empty for TCP).
* ``segment_size``: bytes this process lends to the store (default 0: a pure
  client; memory belongs to the storage nodes). ``buffer_size``: the client's
  transfer buffer (default 64 MiB).

Data path. Values are ``record`` header + payload. A put sends both straight
from where they are (``batch_put_from_multi_buffers``: the 64-byte header
from a small registered staging area, the payload from the caller's buffer,
typically the host arena registered through ``register_memory``). A get into
a buffer of the payload's exact size scatters the header into staging and the
payload into the buffer (``batch_get_into_multi_buffers``); a get whose size
is not known reads the value into the client's own transfer buffer
(``batch_get_buffer``) and validates it there.

Failure. Calls that the master cannot answer return RPC error codes (-900
range); those raise ``RemoteError`` so that ``base``'s breaker opens. Per-key
misses (``OBJECT_NOT_FOUND``), transfer failures from a lost storage node and
size mismatches are misses. The client's own RPC timeout is set to the
backend's deadline through ``MC_RPC_TIMEOUT_MS`` unless already set, and its
log is quiet unless ``GLOG_minloglevel`` says otherwise: outages are logged
once by ``base``, not on every call.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from . import record
from .base import RemoteBackend, RemoteError

__all__ = ["MooncakeBackend"]

OBJECT_NOT_FOUND = -704
_RPC_ERRORS = range(-999, -899)          # RPC_FAIL, RPC_TIMEOUT, ...
_HEADER_SLOTS = 1024                     # records per staging round


def _parse_size(text: str) -> int:
    text = text.strip().lower().replace(" ", "")
    for suffix, mult in (("gib", 1 << 30), ("mib", 1 << 20), ("kib", 1 << 10),
                         ("gb", 1 << 30), ("mb", 1 << 20), ("kb", 1 << 10),
                         ("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * mult)
    return int(text)


def _route_address(host: str, port: int) -> str:
    """The local address the kernel would use to reach ``host`` (sends nothing)."""
    try:
        if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
            return "127.0.0.1"
    except (OSError, ValueError):
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, port))
        return sock.getsockname()[0]


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def _handle_view(handle: Any) -> memoryview:
    """A view of a client-owned buffer that keeps the buffer alive while in use."""
    array = (ctypes.c_char * handle.size()).from_address(handle.ptr())
    array.handle = handle
    return memoryview(array).cast("B")


def _replica_size(replicas: Any) -> int | None:
    """Size of the first complete memory replica of a value, if any."""
    for replica in replicas or ():
        if replica.is_memory_replica() and str(replica.status).endswith("COMPLETE"):
            return int(replica.get_memory_descriptor().buffer_descriptor.size)
    return None


class MooncakeBackend(RemoteBackend):
    scheme = "mooncake"

    def __init__(self, url: str, **options: Any):
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        host, port = parts.hostname or "127.0.0.1", parts.port or 50051
        self._master_host, self._master_port = host, port
        self.master_address = f"{host}:{port}"
        self.metadata = query.get("metadata", f"http://{host}:8080/metadata")
        self.local_hostname = query.get("local_hostname") or _route_address(host, port)
        self.protocol = query.get("protocol", "tcp")
        self.device = query.get("device", "")
        self.segment_size = _parse_size(query.get("segment_size", "0"))
        self.buffer_size = _parse_size(query.get("buffer_size", "64MiB"))
        super().__init__(url, **options)
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", self.local_hostname)
        os.environ.setdefault("MC_RPC_TIMEOUT_MS", str(max(100, int(self.timeout * 1000))))
        os.environ.setdefault("MC_RPC_CONNECT_TIMEOUT_MS", str(max(100, int(self.timeout * 1000))))
        os.environ.setdefault("GLOG_minloglevel", "3")
        os.environ.setdefault("MC_LOG_LEVEL", "ERROR")   # the client's own switch; glog's is not read
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as exc:   # pragma: no cover - depends on the install
            raise RemoteError("the mooncake backend needs mooncake-transfer-engine-non-cuda "
                              "(see .ci/install-peers.sh)") from exc
        self._store = MooncakeDistributedStore()
        self._ready = False
        self._setup_lock = threading.Lock()
        self._regions: list[tuple[int, int, Any]] = []     # (start, end, owner)
        self._headers = np.zeros(_HEADER_SLOTS * record.HEADER_SIZE, dtype=np.uint8)
        self._headers_lock = threading.Lock()

    # -------------------------------------------------------------- lifecycle

    def _ensure(self) -> None:
        if self._ready:
            return
        with self._setup_lock:
            if self._ready:
                return
            self._preflight()
            rc = self._store.setup(self.local_hostname, self.metadata, self.segment_size,
                                   self.buffer_size, self.protocol, self.device, self.master_address)
            if rc != 0:
                raise RemoteError(f"mooncake setup against {self.master_address} failed ({rc})")
            self._register(self._headers.ctypes.data, self._headers.nbytes)
            for start, end, _owner in self._regions:
                self._register(start, end - start)
            self._ready = True

    def _preflight(self) -> None:
        """Fail fast when the master or metadata server does not accept connections.

        ``setup`` against a dead master retries for a long time without
        releasing the GIL, which would stall every thread of the daemon.
        """
        endpoints = [(self._master_host, self._master_port)]
        meta = urlsplit(self.metadata)
        if meta.scheme in ("http", "https") and meta.hostname:
            endpoints.append((meta.hostname, meta.port or (443 if meta.scheme == "https" else 80)))
        for host, port in endpoints:
            try:
                socket.create_connection((host, port), timeout=self.timeout).close()
            except OSError as exc:
                raise RemoteError(f"cannot reach {host}:{port}: {exc}") from exc

    def _register(self, address: int, size: int) -> None:
        rc = self._store.register_buffer(address, size)
        if rc != 0:
            raise RemoteError(f"mooncake register_buffer failed ({rc})")

    def register_memory(self, buffer: Any) -> bool:
        view = memoryview(buffer).cast("B")
        start = _address(view)
        self._regions.append((start, start + view.nbytes, buffer))
        if self._ready:
            try:
                self._register(start, view.nbytes)
            except RemoteError:
                self._regions.pop()
                return False
        return True

    def _probe(self) -> None:
        self._ensure()
        self._check_codes(self._store.batch_is_exist([f"{record.object_name(self.namespace, b'')}probe"]))

    def _close(self) -> None:
        if self._ready:
            self._store.close()

    # ------------------------------------------------------------ operations

    @staticmethod
    def _check_codes(codes: list[int]) -> list[int]:
        for code in codes:
            if code in _RPC_ERRORS:
                raise RemoteError(f"mooncake master unreachable (error {code})")
        return codes

    def _sizes(self, names: list[str]) -> list[int | None]:
        self._ensure()
        # Existence first: the replica query logs an error line per absent key, and a lookup's tail is
        # usually absent. Only the leading present names are asked for their sizes.
        codes = self._check_codes(self._store.batch_is_exist(names))
        leading = 0
        while leading < len(names) and codes[leading] == 1:
            leading += 1
        if not leading:
            return [None] * len(names)
        found = self._store.batch_get_replica_desc(names[:leading])
        return [_replica_size(found.get(name)) for name in names[:leading]] + [None] * (len(names) - leading)

    def _get(self, names: list[str]) -> list[Any]:
        self._ensure()
        handles = self._store.batch_get_buffer(names)
        if all(h is None for h in handles):
            # Misses and an unreachable master look alike here; ask the master.
            self._check_codes(self._store.batch_is_exist(names[:1]))
        return [None if h is None else _handle_view(h) for h in handles]

    def _get_into(self, names, namespace, keys, views, sums) -> list[int | None]:
        self._ensure()
        out: list[int | None] = [None] * len(names)
        resized: list[tuple[int, int]] = []
        for lo in range(0, len(names), _HEADER_SLOTS):
            idx = list(range(lo, min(lo + _HEADER_SLOTS, len(names))))
            codes = self._scatter(names, namespace, keys, views, idx, out, sums)
            for i, code in zip(idx, codes):
                if code < 0 and code != OBJECT_NOT_FOUND:
                    # A transfer fails when the buffer is not the value's exact
                    # size, or when the node holding it is gone: ask for the size.
                    size = self._store.get_size(names[i])
                    length = size - record.HEADER_SIZE
                    if 0 <= length < views[i].nbytes:
                        resized.append((i, length))
        if resized:
            idx = [i for i, _ in resized]
            trimmed = list(views)
            for i, length in resized:
                trimmed[i] = views[i][:length]
            self._scatter(names, namespace, keys, trimmed, idx, out, sums)
        return out

    def _scatter(self, names, namespace, keys, views, idx, out, sums) -> list[int]:
        """Header of each value in ``idx`` into staging, payload into its view (its checked sum into ``sums``)."""
        with self._headers_lock:
            base = self._headers.ctypes.data
            ptrs = [[base + j * record.HEADER_SIZE, _address(views[i])] for j, i in enumerate(idx)]
            sizes = [[record.HEADER_SIZE, views[i].nbytes] for i in idx]
            codes = self._check_codes(
                self._store.batch_get_into_multi_buffers([names[i] for i in idx], ptrs, sizes))
            for j, (i, code) in enumerate(zip(idx, codes)):
                if code >= 0:
                    header = self._headers[j * record.HEADER_SIZE:(j + 1) * record.HEADER_SIZE]
                    out[i], sums[i] = self._check_record(header, views[i], code, namespace, keys[i])
        return codes

    @staticmethod
    def _check_record(header, view: memoryview, total: int, namespace, key) -> tuple[int, int | None]:
        """(payload length, its checksum), or (-1, None) for a bad value."""
        try:
            length, checksum = record.check_header(header.tobytes(), namespace, key)
            if total != record.HEADER_SIZE + length or length != view.nbytes:
                raise record.RecordError("size mismatch")
            record.check_payload(view, length, checksum)
        except record.RecordError:
            return -1, None
        return length, checksum

    def _put(self, names, headers, payloads) -> list[bool]:
        self._ensure()
        done: list[bool] = []
        for lo in range(0, len(names), _HEADER_SLOTS):
            hi = min(lo + _HEADER_SLOTS, len(names))
            with self._headers_lock:
                base = self._headers.ctypes.data
                ptrs, sizes = [], []
                for j, i in enumerate(range(lo, hi)):
                    off = j * record.HEADER_SIZE
                    self._headers[off:off + record.HEADER_SIZE] = np.frombuffer(headers[i], dtype=np.uint8)
                    if payloads[i].nbytes:
                        ptrs.append([base + off, _address(payloads[i])])
                        sizes.append([record.HEADER_SIZE, payloads[i].nbytes])
                    else:
                        ptrs.append([base + off])
                        sizes.append([record.HEADER_SIZE])
                codes = self._check_codes(
                    self._store.batch_put_from_multi_buffers(names[lo:hi], ptrs, sizes))
            done.extend(code == 0 for code in codes)
        return done

    def _delete(self, names: list[str]) -> int:
        self._ensure()
        codes = self._store.batch_remove(names, True)
        return sum(1 for c in codes if c == 0)

    def delete(self, keys, namespace: str | None = None) -> int:
        """Remove values (tests and operators); returns how many were removed."""
        return self._delete([self.object_name(k, namespace) for k in keys])
