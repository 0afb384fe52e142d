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
"""

from .fleet import DaemonFleet
from .hashring import BoundedHashRing
from .router import Decision, Router

__all__ = ["BoundedHashRing", "DaemonFleet", "Decision", "Router"]
