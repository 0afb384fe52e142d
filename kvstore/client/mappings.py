"""What a local client maps of its daemon: the arena, the published index, the GPU pool; attached at hello.

Owns the mappings of one connection (``connection.py`` attaches them at each hello and detaches them at close;
the client's operations and the credit writer read them). May call: the mapped files (``kvstore/mapped``) and
the page populator; nothing that sends.

A restarted daemon makes new files under the same names, so each mapping remembers the file it mapped (device and
inode) and maps again when that changed. Detaching releases the views first: views of live leases keep the old
mapping alive until they go (``lease.py``).

The arena is mapped twice (``mapped/arena.py``): ``arena_view`` (read-write) is only sliced for slots this
client was lent to fill; ``read_view`` (read-only) for everything handed to a reader, so that no reader can
change the bytes another reader gets. Each mapping has its own page tables, so each has its own populator.

``gpu=True`` (engines on the daemon's GPU): the client asks for the GPU tier's pool at hello, maps it once
(``kvstore.mapped.gpu_pool.MappedPool``) and page-locks its own mappings of the arena; ``get`` then returns a
``uint8`` tensor view of the pool for every chunk the GPU tier holds, and memoryviews for the others
(``reads.py``). Only such clients import torch. Without the mapping (no GPU tier, another GPU, CUDA IPC refused)
everything is read from DRAM as usual: the daemon copies GPU-only chunks down for readers that do not map the pool.
"""

from __future__ import annotations

import os
from typing import Any

from ..mapped.arena import SharedArena
from .pages import PagePopulator
from ..binding import namespace_mask
from ..mapped.index_reader import SharedIndexView


def file_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class Mappings:
    """One connection's mappings of its daemon's files; every attribute is None while that file is not mapped."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace   # the index is read through this namespace's binding
        self.arena: SharedArena | None = None         # another object once a restarted daemon's arena is mapped
        self.arena_view: memoryview | None = None     # read-write: only the slots this client was lent
        self.read_view: memoryview | None = None      # read-only: everything handed to readers
        self.pages: PagePopulator | None = None       # populates arena_view's pages
        self.read_pages: PagePopulator | None = None  # ... and read_view's
        self.index: SharedIndexView | None = None     # the daemon's published lookup index
        self.gpu_pool: Any = None      # kvstore.mapped.gpu_pool.MappedPool, when the daemon's pool is mapped
        self._arena_file: tuple[int, int] | None = None
        self._index_file: tuple[int, int] | None = None
        self._gpu_info: dict[str, Any] | None = None
        self._page_locked: Any = None   # kvstore.mapped.page_lock.PageLockedRegion of our arena mapping
        self._read_locked: Any = None   # ... and of our read-only one

    def attach_arena(self, arena: dict[str, Any] | None) -> None:
        """Map the arena the daemon named at hello (None: none, e.g. over tcp://)."""
        # A restarted daemon makes a new arena file under the same path: compare the file, not just its name,
        # or puts would land in (and gets read from) the dead predecessor's memory.
        if arena and (self.arena is None or self._arena_file != file_identity(arena["path"])
                      or self.arena.size != arena["size"]):
            self.detach_arena()
            self._arena_file = file_identity(arena["path"])
            self.arena = SharedArena.attach(arena["path"], int(arena["size"]))
            self.arena_view = self.arena.view()
            self.read_view = self.arena.read_view()
            self.pages = PagePopulator(self.arena.buf, self.arena.size)
            self.read_pages = PagePopulator(self.arena.read_buf or self.arena.buf, self.arena.size)
        elif not arena:
            self.detach_arena()

    def attach_index(self, path: str | None) -> None:
        """Map the daemon's lookup index; a restarted daemon has a new file under the same name."""
        if path and self.index is not None and self._index_file == file_identity(path):
            return
        self.detach_index()
        if path:
            self._index_file = file_identity(path)
            self.index = SharedIndexView.open(path, namespace_mask(self.namespace))

    def detach_index(self) -> None:
        if self.index is not None:
            self.index.close()
        self.index, self._index_file = None, None

    def attach_gpu(self, info: dict[str, Any] | None) -> None:
        """Map the daemon's GPU pool (once per daemon) and pin our arena mapping for async host<->GPU copies."""
        if info == self._gpu_info and (info is None or self.gpu_pool is not None):
            return
        self._detach_gpu()
        self._gpu_info = info
        if not info:
            return
        from ..mapped.gpu_pool import MappedPool  # torch: only for clients that ask for the GPU tier

        self.gpu_pool = MappedPool.from_hello(info)
        if self.gpu_pool is not None and self.gpu_pool.device.type == "cuda":
            self.page_lock_arena()

    def page_lock_arena(self) -> None:
        """Page-lock both our mappings of the arena (CUDA): reads go from the read-only one, writes to the other."""
        if self._page_locked is not None or self.arena is None:
            return
        from ..mapped.gpu_pool import page_lock_mapping  # torch: only for clients that ask for page-locking

        self._page_locked = page_lock_mapping(self.arena.buf, self.arena.size)
        if self.arena.read_buf is not None:
            self._read_locked = page_lock_mapping(self.arena.read_buf, self.arena.size, read_only=True)

    def _detach_gpu(self) -> None:
        for region in (self._page_locked, self._read_locked):
            if region is not None:
                region.unlock()
        self._page_locked = self._read_locked = None
        if self.gpu_pool is not None:
            self.gpu_pool.close()
            self.gpu_pool = None
        self._gpu_info = None

    def populate(self) -> int:
        """Populate both mappings of the whole arena now (``Client.populate_arena``); the bytes of arena populated
        (0 without an arena)."""
        if self.pages is None or self.arena is None:
            return 0
        self.pages.touch(0, self.arena.size)
        if self.read_pages is not None:
            self.read_pages.touch(0, self.arena.size)
        return self.arena.size

    def detach_arena(self) -> None:
        self._detach_gpu()   # unpin before unmapping
        for view in (self.arena_view, self.read_view):
            try:
                if view is not None:
                    view.release()
            except BufferError:
                pass  # views of live leases still point into it; the mapping goes when they do
        if self.arena is not None:
            self.arena.close()
        self.arena, self.arena_view, self.pages = None, None, None
        self.read_view, self.read_pages = None, None
