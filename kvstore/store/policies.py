"""The eviction policies the ``eviction_policy`` setting names, each an ``eviction.EvictionQueue``.

``chain-lru`` (the default): least recently used first, chains touched deepest first so that continuations go
before their prefixes. ``lru``: plain LRU, chains touched prefix first (a prefix can leave before its
continuations, stranding them). ``s3-fifo``: frequency-aware FIFO queues (see ``s3fifo.py``).
``kvstore simulate`` compares them on a trace; docs/deployment/capacity-planning.md has the figures.
"""

from __future__ import annotations

from typing import Callable

from ..defaults import DEFAULT_POLICY, EVICTION_POLICIES
from .eviction import EvictionQueue, LruQueue, PrefixFirstLruQueue
from .s3fifo import S3FifoQueue

__all__ = ["DEFAULT_POLICY", "POLICIES", "make_queue"]

# The queue of each policy, in the order ``defaults.EVICTION_POLICIES`` names them.
POLICIES: dict[str, Callable[[], EvictionQueue]] = dict(zip(EVICTION_POLICIES,
                                                            (LruQueue, PrefixFirstLruQueue, S3FifoQueue)))


def make_queue(policy: str) -> EvictionQueue:
    """A new empty queue of the named policy (the name is checked where settings are read)."""
    return POLICIES[policy]()
