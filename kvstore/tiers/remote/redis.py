"""Redis / Valkey / Redis Cluster backend, through redis-py.

URL: ``redis://[user:pass@]host:port[/db]`` or ``rediss://`` (TLS), with query
parameters ``cluster=1`` (Redis Cluster: the client follows the slot map),
``ttl=SECONDS`` (expire values server-side). Valkey
speaks the same protocol and uses the same URL.

Every batch is one pipelined round trip (``EXISTS``/``GET``/``SET`` per
object, no transaction: keys of one batch may live on different cluster
slots). A value is ``record`` header + payload written by one ``SET``, so a
reader sees all of it or nothing. Eviction by ``maxmemory`` or a TTL simply
makes a later ``GET`` return nothing: a miss. Socket timeouts equal the
backend's deadline and redis-py's own retries are off, so a dead server costs
one failed call, after which the breaker in ``base`` takes over.
"""

from __future__ import annotations

from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit, urlunsplit

from .base import RemoteBackend, RemoteError

__all__ = ["RedisBackend"]


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


class RedisBackend(RemoteBackend):
    scheme = "redis"

    def __init__(self, url: str, **options: Any):
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:   # pragma: no cover - depends on the install
            raise RemoteError("the redis backend needs redis-py: pip install 'kvstore[remote]'") from exc
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.ttl = int(query.pop("ttl", "0")) or None
        cluster = _truthy(query.pop("cluster", "0"))
        super().__init__(url, **options)
        self._errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                        redis.exceptions.ClusterError, OSError)
        client_url = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        common = dict(socket_timeout=self.timeout + 64 * (1 << 20) / self.min_rate,
                      socket_connect_timeout=self.timeout, health_check_interval=0)
        self._factory: Callable[[], Any] | None   # builds the cluster client on first use
        self._conn: Any
        if cluster:
            from redis.cluster import RedisCluster
            # RedisCluster reads the slot map when built: build it on first use,
            # on a worker thread, so that a cluster that is down at start-up is
            # an outage like any other rather than an error in the constructor.
            self._factory = lambda: RedisCluster.from_url(client_url, **common)
            self._conn = None
        else:
            self._factory = None
            self._conn = redis.Redis.from_url(client_url, retry=Retry(NoBackoff(), 0), **common)

    @property
    def _client(self):
        if self._conn is None:
            assert self._factory is not None   # only a cluster client is built late
            try:
                self._conn = self._factory()
            except self._errors as exc:
                raise RemoteError(f"redis cluster unreachable: {exc}") from exc
        return self._conn

    def _pipeline(self):
        return self._client.pipeline(transaction=False)

    def _run(self, pipe) -> list[Any]:
        results = pipe.execute(raise_on_error=False)
        for item in results:
            if isinstance(item, self._errors):
                raise RemoteError(str(item)) from item
        return results

    def _sizes(self, names: list[str]) -> list[int | None]:
        pipe = self._pipeline()
        for name in names:
            pipe.strlen(name)
        return [item if isinstance(item, int) and item > 0 else None for item in self._run(pipe)]

    def _get(self, names: list[str]) -> list[Any]:
        pipe = self._pipeline()
        for name in names:
            pipe.get(name)
        return [item if isinstance(item, bytes) else None for item in self._run(pipe)]

    def _put(self, names, headers, payloads) -> list[bool]:
        pipe = self._pipeline()
        for name, header, payload in zip(names, headers, payloads):
            pipe.set(name, b"".join((header, payload)), ex=self.ttl)
        # A per-key error (e.g. OOM under maxmemory noeviction) fails that key only.
        return [item is True for item in self._run(pipe)]

    def _probe(self) -> None:
        self._client.ping()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def _delete(self, names: list[str]) -> int:
        return int(self._client.delete(*names)) if names else 0

    def delete(self, keys, namespace: str | None = None) -> int:
        """Remove values (for tests and operators); returns how many existed."""
        return self._delete([self.object_name(k, namespace) for k in keys])
