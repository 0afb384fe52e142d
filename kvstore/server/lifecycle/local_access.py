"""What local clients get besides the ZeroMQ socket: the published lookup index and the stream socket, and who
may map the daemon's files.

Both are opened onto the daemon's start-up claims (``startup.py``), so that a failed start, a stop and a forced
exit remove their files like the arena's. The index (``mapped/index_writer.py``) is created with the Store and
fed by it; the stream socket (``server/transport/stream.py``) is bound once the event loop runs. Either may be missing —
the index on a machine whose memory model the reader cannot rely on, the stream where its path cannot be bound —
and clients then ask the ZeroMQ socket.

Who maps the files. The arena, the shared index and the GPU pool hold every tenant's chunks, so only the daemon's
own user (and root, which can open any file anyway) is offered them at hello (``may_map``). Another local user —
one the operator let reach the stream socket (``socket_group``) — is named neither file in its hello: its puts and
gets carry the bytes in the messages, on the stream socket, whose every request is its peer's (``SO_PEERCRED``).
The check is the daemon's, on the peer's uid, not the files' modes alone: a file loosened by mistake is still not
offered. On the ZeroMQ ipc socket (the daemon user's alone) the uid is libzmq's ``Peer-Address`` property
(``host:uid:gid:pid`` on Linux); where it carries none, the socket's mode is the check.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ...config import ServerConfig
from ...protocol.index_layout import REMOTE, supported
from ...mapped.index_writer import PublishedIndex, index_path_for
from ...tenants.access import Principal
from .startup import Claims
from ..transport.stream import SUFFIX, Dispatcher, StreamServer


EXPECTED_CHUNK_BYTES = 64 << 10   # sizes the index at start: one slot per 64 KiB of DRAM (it grows past that)


def open_index(config: ServerConfig, claims: Claims) -> PublishedIndex | None:
    """The lookup index in shared memory, for the Store to publish into (x86-64 only: see
    protocol/index_layout.py); None where it is not supported. Whoever hands it to a Store also registers
    ``Publishing.stop_publishing`` (``store/publishing.py``) after this, so that the Store lets go of it before
    it closes."""
    if not supported():
        return None
    index = PublishedIndex(index_path_for(config.socket), config.host_mem // EXPECTED_CHUNK_BYTES)
    claims.take(index.close)
    claims.leftovers.append(index.path)
    index.set_flag(REMOTE, bool(config.remote))
    return index


async def open_stream(dispatcher: Dispatcher, config: ServerConfig, loop: asyncio.AbstractEventLoop,
                      claims: Claims, tasks: set[asyncio.Task]) -> StreamServer | None:
    """Listen on the stream socket next to the ZeroMQ one (given to ``socket_group``, if set); None when it cannot
    be bound (logged)."""
    stream = StreamServer(dispatcher, config.socket + SUFFIX, tasks, config.chunk_limit, config.socket_group)
    if not await stream.start(loop):
        return None
    claims.take(stream.remove_file)   # its connections are closed on the loop, at the end of the stop
    claims.leftovers.append(stream.path)
    return stream


def may_map(principal: Principal | None, transport: str, zmq_frame: Any = None) -> bool:
    """Whether a client that says hello may be offered the arena, the shared index and the GPU pool: a local one
    whose uid is the daemon's or root's. On the stream socket the uid is ``SO_PEERCRED``'s (unknown: no); on the
    ZeroMQ ipc socket it is the frame's ``Peer-Address`` where libzmq gives one, else the socket's owner-only
    mode stands for it."""
    if transport != "ipc":
        return False
    uid = principal.uid if principal is not None else zmq_peer_uid(zmq_frame) if zmq_frame is not None else None
    if uid is None:
        return principal is None   # a ZeroMQ peer libzmq names no uid for; a stream peer without one is refused
    return uid in (0, os.getuid())


def zmq_peer_uid(frame: Any) -> int | None:
    """The uid libzmq read with ``SO_PEERCRED`` for the ipc connection that carried ``frame`` (its
    ``Peer-Address`` is ``host:uid:gid:pid``), or None where it gives none."""
    try:
        parts = str(frame.get("Peer-Address")).split(":")
    except Exception:   # noqa: BLE001 - a libzmq or frame without the property: no uid
        return None
    return int(parts[-3]) if len(parts) >= 4 and parts[-3].isdigit() else None
