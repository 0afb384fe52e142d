"""What local clients get besides the ZeroMQ socket: the published lookup index and the stream socket.

Both are opened onto the daemon's start-up claims (``startup.py``), so that a failed start, a stop and a forced
exit remove their files like the arena's. The index (``store/published_index.py``) is created with the Store and
fed by it; the stream socket (``server/stream.py``) is bound once the event loop runs. Either may be missing —
the index on a machine whose memory model the reader cannot rely on, the stream where its path cannot be bound —
and clients then ask the ZeroMQ socket.
"""

from __future__ import annotations

import asyncio

from ..config import ServerConfig
from ..protocol.index_layout import REMOTE, supported
from ..store.published_index import PublishedIndex, index_path_for
from .startup import Claims
from .stream import SUFFIX, Dispatcher, StreamServer


EXPECTED_CHUNK_BYTES = 64 << 10   # sizes the index at start: one slot per 64 KiB of DRAM (it grows past that)


def open_index(config: ServerConfig, claims: Claims) -> PublishedIndex | None:
    """The lookup index in shared memory, for the Store to publish into (x86-64 only: see
    protocol/index_layout.py); None where it is not supported. Whoever hands it to a Store also registers
    ``Store.stop_publishing`` after this, so that the Store lets go of it before it closes."""
    if not supported():
        return None
    index = PublishedIndex(index_path_for(config.socket), config.host_mem // EXPECTED_CHUNK_BYTES)
    claims.take(index.close)
    claims.leftovers.append(index.path)
    index.set_flag(REMOTE, bool(config.remote))
    return index


async def open_stream(daemon: Dispatcher, config: ServerConfig, loop: asyncio.AbstractEventLoop, claims: Claims,
                      tasks: set[asyncio.Task]) -> StreamServer | None:
    """Listen on the stream socket next to the ZeroMQ one; None when it cannot be bound (logged)."""
    stream = StreamServer(daemon, config.socket + SUFFIX, tasks)
    if not await stream.start(loop):
        return None
    claims.take(stream.remove_file)   # its connections are closed on the loop, at the end of the stop
    claims.leftovers.append(stream.path)
    return stream
