"""Prefix-affinity routing over a fleet of engine instances, each with its own daemon.

```python
from kvstore.routing import DaemonFleet, Router

fleet = DaemonFleet({"a": "tcp://10.0.0.1:7070", "b": "tcp://10.0.0.2:7070"}, namespace="llama-3-8b/bf16/tp0of1",
                    chunk_tokens=256, deadline=0.05)
router = Router(list(fleet.instances), fleet.lookup)
decision = router.route(fleet.chunk_keys(token_ids))   # .instance, .reason, .cached_chunks, .lookups
...                                                     # send the request to decision.instance
router.finish(decision.instance)                        # when it has ended
```

Fed by the daemons' KV cache events instead of lookups (``events_index.py``, ``events_router.py``):

```python
from kvstore.routing import EngineRef, EventSource, EventsIndex, EventsRouter, LoadCosts, DaemonCosts

index = EventsIndex([EventSource("d1", "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"), ...])
router = EventsRouter({"pod-a": EngineRef("d1", "kv@pod-a@llama"), ...}, index,
                      LoadCosts(bytes_per_block=2 << 20, prefill_ns_per_block=2e6),
                      measured=DaemonCosts({"d1": "tcp://10.0.0.1:7070", ...}))
decision = router.route(block_hashes)                    # .instance, .reason, .blocks, .score, .scores
```
"""

from .events_index import EventsIndex, EventSource
from .events_router import DaemonCosts, EngineRef, EventsDecision, EventsRouter, LoadCosts
from .fleet import DaemonFleet
from .hashring import BoundedHashRing
from .router import Decision, Router

__all__ = ["BoundedHashRing", "DaemonCosts", "DaemonFleet", "Decision", "EngineRef", "EventSource", "EventsDecision",
           "EventsIndex", "EventsRouter", "LoadCosts", "Router"]
