"""The remote tier's contract: batched exists/get/put with deadlines and an outage breaker.

A remote store (Redis/Valkey, Mooncake Store) sits below the disk tier. It is
an optimisation twice removed, so the one rule is that it never makes a local
hit slower and never hands out bad bytes:

* **Deadlines.** Every store call runs on the backend's one worker pool (the
  only executor on the remote path: the mover awaits the same calls with
  ``lookup_async`` / ``get_into_async``); the caller waits at most ``timeout``
  seconds for a metadata call (sizes, probe) and ``timeout + bytes / min_rate``
  for a data call, then treats the call as failed. A client library stuck in a
  reconnect loop keeps only its worker. A background put keeps its worker (and
  the caller keeps its slots) until the call returns; one that returns after
  its deadline counts as a timeout.
* **Breaker** (``kvstore/breaker.py``). The first failed call (error or deadline) opens the breaker and
  logs one warning for the outage. While open, calls return a miss at once
  without touching the store (counted as ``skipped``); at most one probe every
  ``retry_interval`` seconds, started by traffic and never waited for, checks
  whether the store is back. The probe's success closes the breaker and logs
  one line with the outage's length. No timer thread, no blocked caller.
* **Records.** Values carry ``record``'s header and checksum; a value that
  fails validation is a miss (counted as ``corrupt``), never KV bytes.
* **Best-effort writes.** ``submit_put`` queues a background write and drops
  it (counted) when the queue already holds ``max_pending_bytes`` or the store
  is down: the remote copy is a cache, not a journal.

Subclasses implement six small methods on object *names* (already derived
from namespace and key): ``_sizes``, ``_get``, ``_put``, ``_delete``,
``_probe`` and ``_close``, plus optionally ``_get_into`` / ``register_memory`` for zero-copy.
They may block; they raise on store failure and return ``None``/``False`` for
a plain miss.

``url`` is the shown form, password replaced (``security/redact.py``): the
real URL stays with the subclass's client and never reaches a log line,
``repr``, ``stats`` or an exception message.
"""

from __future__ import annotations

import concurrent.futures as cf
import enum
import time
from collections.abc import Sequence
from typing import Any

from ... import logs
from ...errors import RemoteError
from ...security.redact import redact_url
from . import record
from .guarded import GuardedCalls

__all__ = ["Health", "RemoteBackend", "RemoteError"]


MiB = 1 << 20


class Health(enum.Enum):
    UP = "up"
    DOWN = "down"


class RemoteBackend(GuardedCalls):
    """Base of remote-store backends; see the module docstring for the behaviour."""

    scheme = ""

    def __init__(self, url: str, *, namespace: str = "kvstore", timeout: float = 1.0,
                 retry_interval: float = 1.0, min_rate: float = 256 * MiB,
                 max_pending_bytes: int = 1 << 30, workers: int = 2):
        self.url = redact_url(url)   # what logs, repr and errors show; subclasses connect with ``url`` itself
        self.namespace = namespace
        self.timeout = float(timeout)
        self.retry_interval = float(retry_interval)
        self.min_rate = float(min_rate)
        self.max_pending_bytes = int(max_pending_bytes)
        super().__init__(self.url, workers, self.retry_interval)
        self._pending_bytes = 0
        self._size_hint = 0          # largest value seen: sizes a batch_get deadline

    # ------------------------------------------------------------------ public

    @property
    def health(self) -> Health:
        return Health.UP if self._breaker.closed else Health.DOWN

    @property
    def healthy(self) -> bool:
        return self._breaker.closed

    def object_name(self, key: bytes, namespace: str | None = None) -> str:
        return record.object_name(self.namespace if namespace is None else namespace, key)

    def batch_lookup(self, keys: Sequence[bytes], namespace: str | None = None) -> list[int]:
        """Payload sizes of the leading ``keys`` the store holds ([] on any failure).

        One batched metadata call. Promotion uses it to allocate slots of the
        exact size before ``batch_get_into``. A value's size is read from the
        store, not validated: the get that follows still checks the record.
        """
        if not keys:
            return []
        names = [self.object_name(k, namespace) for k in keys]
        return self._leading_sizes(self._call(self.timeout, self._sizes, names))

    async def lookup_async(self, keys: Sequence[bytes], namespace: str | None = None) -> list[int]:
        """``batch_lookup`` awaited on the event loop (the call runs on the backend's pool)."""
        if not keys:
            return []
        names = [self.object_name(k, namespace) for k in keys]
        return self._leading_sizes(await self._acall(self.timeout, self._sizes, names))

    @staticmethod
    def _leading_sizes(sizes: list[int | None] | None) -> list[int]:
        out: list[int] = []
        for size in sizes or ():
            if size is None or size < record.HEADER_SIZE:
                break
            out.append(size - record.HEADER_SIZE)
        return out

    def batch_get_into(self, keys: Sequence[bytes], buffers: Sequence[Any],
                       namespace: str | None = None, sums: list | None = None) -> list[int | None]:
        """Read each value's payload into the writable buffer given for it.

        Returns the payload length written per key, or ``None`` for a miss, a
        bad value, a buffer too small, or any failure (then the buffer's bytes
        are unspecified). ``sums``, when given, receives each value's checked
        payload checksum (``None`` where no payload was written).
        """
        if len(keys) != len(buffers):
            raise ValueError("one buffer per key")
        if not keys:
            return []
        args, deadline, got_sums = self._get_into_args(keys, buffers, namespace)
        return self._got(self._call(deadline, self._get_into, *args), got_sums, sums)

    async def get_into_async(self, keys: Sequence[bytes], buffers: Sequence[Any], namespace: str | None = None,
                             sums: list | None = None) -> list[int | None]:
        """``batch_get_into`` awaited on the event loop (the call runs on the backend's pool)."""
        if len(keys) != len(buffers):
            raise ValueError("one buffer per key")
        if not keys:
            return []
        args, deadline, got_sums = self._get_into_args(keys, buffers, namespace)
        return self._got(await self._acall(deadline, self._get_into, *args), got_sums, sums)

    def _get_into_args(self, keys: Sequence[bytes], buffers: Sequence[Any], namespace: str | None):
        ns = self.namespace if namespace is None else namespace
        names = [record.object_name(ns, k) for k in keys]
        views = [memoryview(b).cast("B") for b in buffers]
        got_sums: list[int | None] = [None] * len(keys)
        return (names, ns, list(keys), views, got_sums), self._data_deadline(sum(v.nbytes for v in views)), got_sums

    def _got(self, result: list[int | None] | None, got_sums: list[int | None],
             sums: list | None) -> list[int | None]:
        if sums is not None:
            sums[:] = got_sums if result is not None else [None] * len(got_sums)
        if result is None:
            return [None] * len(got_sums)
        return [self._count_get(n) for n in result]

    def submit_put(self, keys: Sequence[bytes], payloads: Sequence[Any],
                   namespace: str | None = None, sums: Sequence[int | None] | None = None) -> cf.Future | None:
        """Queue a background put; ``None`` if dropped (store down or queue full).

        The payload buffers must stay valid until the returned future is done;
        its result is the number of values stored (0 on failure, never raises).
        ``sums`` are the payloads' own checksums, carried into the records.
        """
        if len(keys) != len(payloads):
            raise ValueError("one payload per key")
        views = [memoryview(p).cast("B") for p in payloads]
        nbytes = sum(v.nbytes for v in views)
        with self._lock:
            if (self._closed or not self._allow_locked()
                    or self._pending_bytes + nbytes > self.max_pending_bytes):
                self.counters["put_dropped"] += len(keys)
                return None
            self._pending_bytes += nbytes
            self.counters["calls"] += 1
        ns = self.namespace if namespace is None else namespace
        deadline = self._data_deadline(nbytes)

        def run() -> int:
            started = time.monotonic()
            try:
                stored = self._put_records(ns, list(keys), views, sums)
            except Exception as exc:   # noqa: BLE001 - the store failing is a dropped put
                self._failed(exc)
                return 0
            finally:
                with self._lock:
                    self._pending_bytes -= nbytes
            took = time.monotonic() - started
            if took > deadline:
                with self._lock:
                    self.counters["timeouts"] += 1
                self._failed(f"put took {took:.2f}s, past its {deadline:.2f}s deadline")
            return stored

        try:
            return self._pool.submit(self._tracked, run)
        except RuntimeError:        # pool shut down by close()
            with self._lock:
                self._pending_bytes -= nbytes
            return None

    async def delete_async(self, keys: Sequence[bytes], namespace: str | None = None) -> int | None:
        """Delete the values of ``keys`` (a tenant's oldest, to hold its remote ceiling: ``book.py``), awaited
        on the event loop within the metadata deadline; how many the store removed, None when the call failed
        (the store down, an error, the deadline)."""
        if not keys:
            return 0
        names = [self.object_name(k, namespace) for k in keys]
        return await self._acall(self.timeout, self._delete, names)

    def register_memory(self, buffer: Any) -> bool:
        """Offer a long-lived region (the host arena) for zero-copy transfers.

        A hint: returns whether the backend will transfer straight to and
        from it. Buffers outside registered memory still work, with a copy.
        """
        return False

    def check(self, timeout: float | None = None) -> bool:
        """Probe the store now and wait for the answer; update the health state."""
        fut = self._pool.submit(self._tracked, self._probe)
        try:
            fut.result(self.timeout if timeout is None else timeout)
        except Exception as exc:   # noqa: BLE001 - any failure means "down"
            self._failed(exc if not isinstance(exc, cf.TimeoutError) else "probe timed out")
            return False
        self._recovered()
        return True

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self.counters)
            out["up"] = int(self._breaker.closed)
            out["pending_put_bytes"] = self._pending_bytes
        return out

    def close(self, wait: float = 5.0) -> None:
        """Stop taking calls, let running ones finish (up to ``wait`` s), close the client.

        A client whose calls are still stuck after ``wait`` is left open rather
        than closed under a running call (which native clients do not survive).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + wait
        with self._idle:
            while self._inflight and time.monotonic() < deadline:
                self._idle.wait(deadline - time.monotonic())
            if self._inflight:
                logs.warning("remote_close_unfinished", url=self.url, calls=self._inflight,
                             effect="its client is left open")
                return
        try:
            self._close()
        except Exception as exc:   # noqa: BLE001 - closing is best effort
            logs.debug("remote_close_failed", url=self.url, error=repr(exc))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} {self.health.value}>"

    # ------------------------------------------------------- subclass surface

    def _sizes(self, names: list[str]) -> list[int | None]:
        """Stored value sizes (header included), ``None`` where absent."""
        raise NotImplementedError

    def _get(self, names: list[str]) -> list[Any]:
        """Whole stored values (bytes-like) or ``None`` where absent."""
        raise NotImplementedError

    def _put(self, names: list[str], headers: list[bytes], payloads: list[memoryview]) -> list[bool]:
        """Store ``header + payload`` under each name; per-name success."""
        raise NotImplementedError

    def _delete(self, names: list[str]) -> int:
        """Remove each name's value; how many existed."""
        raise NotImplementedError

    def _probe(self) -> None:
        """Raise if the store cannot serve calls now."""
        raise NotImplementedError

    def _close(self) -> None:
        pass

    def _get_into(self, names: list[str], namespace: str, keys: list[bytes],
                  views: list[memoryview], sums: list[int | None]) -> list[int | None]:
        """Default: fetch whole values, validate, copy the payload into place (its checksum into ``sums``).

        Returns per key the payload length, ``None`` (miss) or ``-1`` (bad value).
        """
        out: list[int | None] = []
        for i, (key, value, view) in enumerate(zip(keys, self._get(names), views)):
            if value is None:
                out.append(None)
                continue
            try:
                payload = record.decode(value, namespace, key)
            except record.RecordError:
                out.append(-1)
                continue
            if payload.nbytes > view.nbytes:
                out.append(-1)
                continue
            view[:payload.nbytes] = payload
            sums[i] = record.check_header(value, namespace, key)[1]
            out.append(payload.nbytes)
        return out

    # ---------------------------------------------------------------- private

    def _put_records(self, namespace: str, keys: list[bytes], views: list[memoryview],
                     sums: Sequence[int | None] | None = None) -> int:
        sums = sums if sums is not None else [None] * len(keys)
        headers = [record.encode_header(namespace, k, v, s) for k, v, s in zip(keys, views, sums)]
        done = self._put([record.object_name(namespace, k) for k in keys], headers, views)
        stored = sum(1 for ok in done if ok)
        with self._lock:
            self.counters["puts"] += stored
            self.counters["put_bytes"] += sum(v.nbytes for v, ok in zip(views, done) if ok)
        return stored

    def _count_get(self, n: int | None):
        with self._lock:
            if n is None:
                self.counters["misses"] += 1
                return None
            if n < 0:
                self.counters["corrupt"] += 1
                self.counters["misses"] += 1
                return None
            self.counters["hits"] += 1
            self.counters["get_bytes"] += n
            self._size_hint = max(self._size_hint, n + record.HEADER_SIZE)
            return n

    def _data_deadline(self, nbytes: int) -> float:
        return self.timeout + nbytes / self.min_rate
