"""The daemon as every connector sees it: keys, lookup, load, store; any failure is a miss.

The cache is an optimisation. Each method here turns a daemon that is down,
slow, full or answering errors (and a chunk whose size does not match the
geometry) into "nothing cached" or "nothing saved", logs it once per kind, and
lets the engine run its normal prefill.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch

import kvstore

from .layout import KVGeometry, chunk_from_buffer

log = logging.getLogger("kvstore.connectors")


class ChunkStore:
    """Chunks of one namespace and geometry, through one client."""

    def __init__(self, client: kvstore.Client, namespace: str, geometry: KVGeometry) -> None:
        self.client = client
        self.namespace = namespace
        self.geometry = geometry
        self._warned: set[str] = set()

    def keys(self, token_ids: Sequence[int] | torch.Tensor) -> list[bytes]:
        """One chained key per full chunk of `token_ids`."""
        return kvstore.chunk_keys(self.namespace, token_ids, self.geometry.chunk_tokens)

    def lookup(self, keys: Sequence[bytes]) -> int:
        """Leading `keys` stored, 0 when the daemon cannot say. Pins nothing."""
        if not keys:
            return 0
        try:
            return self.client.lookup(keys)
        except Exception as exc:  # noqa: BLE001 - any failure is a miss
            self._warn("lookup", exc)
            return 0

    def lookup_tiers(self, keys: Sequence[bytes]) -> tuple[int, dict[str, int]]:
        """Like `lookup`, with how many of the hits each tier holds."""
        if not keys:
            return 0, {}
        try:
            found = self.client.lookup_tiers(keys)
            return found.count, dict(found.tiers)
        except Exception as exc:  # noqa: BLE001
            self._warn("lookup", exc)
            return 0, {}

    def load(self, keys: Sequence[bytes], device: torch.device | str = "cpu") -> torch.Tensor:
        """The longest loadable prefix of `keys` as `[n, *chunk_shape]` on `device`.

        Bytes are copied out of the leased views before the lease ends. A chunk
        of the wrong size ends the prefix there.
        """
        out = self.geometry.empty_chunks(0, device)
        if not keys:
            return out
        try:
            with self.client.get(keys) as views:
                chunks = []
                for view in views:
                    try:
                        chunks.append(chunk_from_buffer(view, self.geometry))
                    except ValueError as exc:
                        self._warn("chunk size", exc)
                        break
                if chunks:
                    out = self.geometry.empty_chunks(len(chunks), device)
                    for i, chunk in enumerate(chunks):
                        out[i].copy_(chunk)
                    if out.is_cuda:
                        torch.cuda.current_stream(out.device).synchronize()
            return out
        except Exception as exc:  # noqa: BLE001
            self._warn("get", exc)
            return self.geometry.empty_chunks(0, device)

    def store(self, keys: Sequence[bytes], chunks: torch.Tensor, first: int) -> int:
        """Store `chunks` under `keys[first:first + len(chunks)]`; returns chunks written.

        `keys` is the whole chain so that the parent of the first new chunk is
        known to the daemon (it evicts continuations before their prefixes).
        """
        if len(chunks) == 0:
            return 0
        new_keys = list(keys[first:first + len(chunks)])
        parent = keys[first - 1] if first > 0 else None
        try:
            return self.client.put(new_keys, list(chunks), parent=parent)
        except Exception as exc:  # noqa: BLE001
            self._warn("put", exc)
            return 0

    def _warn(self, what: str, exc: BaseException) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("kvstore %s failed, running without the cache: %s", what, exc)
        else:
            log.debug("kvstore %s failed: %s", what, exc)
