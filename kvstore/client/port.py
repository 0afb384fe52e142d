"""What the client's helpers use of the session they serve: the one interface between ``session.py`` and
``credit.py``, ``lease.py`` and ``verify.py``.

A protocol rather than an import of ``session.py``, which imports those helpers. ``Session`` implements it; the
helpers touch nothing else of it (no private member of the Client).
"""

from __future__ import annotations

from typing import Any, Protocol


class SessionPort(Protocol):
    """The session's arena mapping, its shared index, and its three ways of sending a request."""

    server_info: dict[str, Any]

    @property
    def arena(self) -> Any:
        """The mapped arena (``mapped/arena.py`` SharedArena), or None; another object after a restart."""
        ...

    @property
    def arena_view(self) -> memoryview | None:
        """The read-write view of the arena, or None."""
        ...

    @property
    def pages(self) -> Any:
        """The arena's page populator (``client/pages.py``), or None."""
        ...

    @property
    def shared_index(self) -> Any:
        """The mapped shared index (``mapped/index_reader.py`` SharedIndexView), or None."""
        ...

    @property
    def transport(self) -> Any:
        """Where requests go now (the stream socket, else ZeroMQ), bypassing the session's retry and notes."""
        ...

    def request(self, header: dict[str, Any], payloads: list[Any] | None = None,
                retry: bool = True) -> tuple[dict[str, Any], list[Any]]:
        """Send one request and wait for its reply, saying hello again (and retrying once when ``retry``) after a
        daemon restart."""
        ...

    def send_request(self, header: dict[str, Any]) -> int:
        """Send one request of a pipelined batch without waiting; ``wait_reply`` collects its answer."""
        ...

    def wait_reply(self, rid: int) -> dict[str, Any]:
        """The reply header to the request ``rid`` sent by ``send_request``."""
        ...
