"""Asking a fleet of daemons, in parallel and with a deadline, how much of a request each one holds.

One client per instance, connected lazily and without the shared arena (only ``lookup`` is used, with
``promote=False`` so that asking does not make a daemon read anything from disk). Lookups go out on a thread
pool at once and the caller waits at most ``deadline`` seconds; the clients' own timeout is the deadline too,
so a thread never outlives it by much. An instance that did not answer in time, refused the connection or is
still busy with an earlier lookup answers None (counted as holding nothing). After a failure the instance is
not asked again for ``retry_after`` seconds (a breaker per instance, ``kvstore/breaker.py``), so a dead daemon
costs no threads on every request.
"""

from __future__ import annotations

import concurrent.futures
from typing import Mapping, Sequence

from ..breaker import Breaker
from ..client.client import Client
from ..errors import KVStoreError
from ..keys import chunk_keys

DEADLINE = 0.05
RETRY_AFTER = 1.0


class DaemonFleet:
    def __init__(self, instances: Mapping[str, str], namespace: str, chunk_tokens: int,
                 deadline: float = DEADLINE, retry_after: float = RETRY_AFTER) -> None:
        if not instances:
            raise ValueError("a fleet needs at least one instance")
        for name, address in instances.items():
            if not address.startswith(("ipc://", "tcp://")):
                raise ValueError(f"instance {name!r}: address must start with ipc:// or tcp://, got {address!r}")
        if deadline <= 0:
            raise ValueError(f"deadline must be positive, got {deadline}")
        self.instances = dict(instances)
        self.namespace = namespace
        self.chunk_tokens = chunk_tokens
        self.deadline = deadline
        self.retry_after = retry_after
        self._pool = concurrent.futures.ThreadPoolExecutor(len(instances), thread_name_prefix="kvstore-route")
        self._clients: dict[str, Client] = {}
        self._busy: dict[str, concurrent.futures.Future] = {}
        self._breakers = {name: Breaker(retry_after) for name in self.instances}

    def chunk_keys(self, token_ids: Sequence[int]) -> list[bytes]:
        return chunk_keys(self.namespace, token_ids, self.chunk_tokens)

    def lookup(self, keys: Sequence[bytes]) -> dict[str, int | None]:
        """Leading ``keys`` each instance holds; None for those that did not answer within the deadline."""
        asked: dict[str, concurrent.futures.Future] = {}
        for name in self.instances:
            earlier = self._busy.get(name)
            if (earlier is not None and not earlier.done()) or not self._breakers[name].allows():
                continue
            asked[name] = self._busy[name] = self._pool.submit(self._ask, name, list(keys))
        concurrent.futures.wait(asked.values(), timeout=self.deadline)
        answers: dict[str, int | None] = {name: None for name in self.instances}
        for name, fut in asked.items():
            if fut.done() and fut.exception() is None:
                answers[name] = fut.result()
        return answers

    def _ask(self, name: str, keys: list[bytes]) -> int:
        try:
            client = self._clients.get(name)
            if client is None:
                client = Client(self.instances[name], self.namespace, self.chunk_tokens, timeout=self.deadline,
                                use_arena=False)
                self._clients[name] = client
            count = client.lookup_tiers(keys, promote=False).count
        except KVStoreError:
            self._breakers[name].failed()
            client = self._clients.pop(name, None)
            if client is not None:
                client.close()
            raise
        self._breakers[name].succeeded()
        return count

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __enter__(self) -> "DaemonFleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
