"""The daemon, in four rooms.

- ``lifecycle/``: start-up claims and checks, the tiers opened onto them, the daemon process and its loop, its
  one dispatcher of requests and the sessions, the stop budget, service-manager notification, the heap. It
  builds and owns everything below and may import every other room.
- ``requests/``: one handler per wire operation over the service (what a handler may touch), what the daemon
  knows of each client session, hello's compatibility check, stats, integrity, invalidation and reload. It may
  import ``events/``; never ``lifecycle/``.
- ``transport/``: requests off the sockets (ZeroMQ reactor, local stream socket, tcp:// peers) and the
  refusals of oversized ones. It imports no other room: requests reach it through the dispatcher it is given.
- ``events/``: the KV cache event publisher. It imports no other room.
"""
