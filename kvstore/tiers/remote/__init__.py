"""Remote tier backends: Redis/Valkey and Mooncake Store behind one small interface.

``open_backend(url, **options)`` picks the backend from the URL scheme:
``redis://``, ``rediss://`` (Redis, Valkey, Redis Cluster with ``?cluster=1``)
or ``mooncake://master:port?metadata=...``. See ``base.RemoteBackend``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ...security.redact import redact_url
from .base import Health, RemoteBackend, RemoteError

__all__ = ["Health", "RemoteBackend", "RemoteError", "open_backend"]


def open_backend(url: str, **options: Any) -> RemoteBackend:
    """A backend for ``url``; ``options`` go to ``RemoteBackend.__init__``.

    Options: ``namespace`` (default "kvstore"), ``timeout`` (1.0 s per metadata
    call), ``retry_interval`` (1.0 s between probes while down), ``min_rate``
    (bytes/s assumed for data-call deadlines), ``max_pending_bytes`` (background
    put queue), ``workers`` (threads per direction).
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("redis", "rediss", "valkey", "valkeys", "unix"):
        from .redis import RedisBackend
        if scheme.startswith("valkey"):
            url = "redis" + url[len("valkey"):]
        return RedisBackend(url, **options)
    if scheme == "mooncake":
        from .mooncake import MooncakeBackend
        return MooncakeBackend(url, **options)
    raise ValueError(f"unknown remote store scheme {scheme!r} in {redact_url(url)!r} (redis://, rediss://, mooncake://)")
