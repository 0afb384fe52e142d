"""Requests: one handler per wire operation over the service (what a handler may touch), client sessions,
hello's compatibility check, stats, integrity, invalidation and reload. May import ``events/``, never
``lifecycle/``: handlers are handed what they use."""
