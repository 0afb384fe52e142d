"""What a local client maps of its daemon: the arena, the published index, the GPU pool; attached at hello.

A restarted daemon makes new files under the same names, so each mapping remembers the file it mapped (device and
inode) and maps again when that changed. Detaching releases the views first: views of live leases keep the old
mapping alive until they go (``lease.py``).

The arena is mapped twice (``mapped/arena.py``): ``_arena_view`` (read-write) is only sliced for slots this
client was lent to fill; ``_read_view`` (read-only) for everything handed to a reader, so that no reader can
change the bytes another reader gets. Each mapping has its own page tables, so each has its own populator.
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
    """The Client's mappings (a base class: the Client's session code attaches them, its operations read them)."""

    namespace: str
    _arena: SharedArena | None
    _arena_view: memoryview | None
    _read_view: memoryview | None
    _pages: PagePopulator | None
    _read_pages: PagePopulator | None
    _index: SharedIndexView | None
    _index_file: tuple[int, int] | None
    _gpu_pool: Any
    _gpu_info: dict[str, Any] | None
    _page_locked: Any
    _read_locked: Any

    _arena_file: tuple[int, int] | None

    def _no_mappings(self) -> None:
        self._arena, self._arena_view, self._pages, self._arena_file = None, None, None, None
        self._read_view, self._read_pages = None, None
        self._index, self._index_file = None, None
        self._gpu_pool = None      # kvstore.mapped.gpu_pool.MappedPool, when the daemon's pool is mapped
        self._gpu_info = None
        self._page_locked = None   # kvstore.mapped.page_lock.PageLockedRegion of our arena mapping
        self._read_locked = None   # ... and of our read-only one

    def _attach_arena(self, arena: dict[str, Any] | None) -> None:
        """Map the arena the daemon named at hello (None: none, e.g. over tcp://)."""
        # A restarted daemon makes a new arena file under the same path: compare the file, not just its name,
        # or puts would land in (and gets read from) the dead predecessor's memory.
        if arena and (self._arena is None or self._arena_file != file_identity(arena["path"])
                      or self._arena.size != arena["size"]):
            self._detach_arena()
            self._arena_file = file_identity(arena["path"])
            self._arena = SharedArena.attach(arena["path"], int(arena["size"]))
            self._arena_view = self._arena.view()
            self._read_view = self._arena.read_view()
            self._pages = PagePopulator(self._arena.buf, self._arena.size)
            self._read_pages = PagePopulator(self._arena.read_buf or self._arena.buf, self._arena.size)
        elif not arena:
            self._detach_arena()

    def _attach_index(self, path: str | None) -> None:
        """Map the daemon's lookup index; a restarted daemon has a new file under the same name."""
        if path and self._index is not None and self._index_file == file_identity(path):
            return
        self._detach_index()
        if path:
            self._index_file = file_identity(path)
            self._index = SharedIndexView.open(path, namespace_mask(self.namespace))

    def _detach_index(self) -> None:
        if self._index is not None:
            self._index.close()
        self._index, self._index_file = None, None

    def _attach_gpu(self, info: dict[str, Any] | None) -> None:
        """Map the daemon's GPU pool (once per daemon) and pin our arena mapping for async host<->GPU copies."""
        if info == self._gpu_info and (info is None or self._gpu_pool is not None):
            return
        self._detach_gpu()
        self._gpu_info = info
        if not info:
            return
        from ..mapped.gpu_pool import MappedPool  # torch: only for clients that ask for the GPU tier

        self._gpu_pool = MappedPool.from_hello(info)
        if self._gpu_pool is not None and self._gpu_pool.device.type == "cuda":
            self._page_lock_arena()

    def _page_lock_arena(self) -> None:
        """Page-lock both our mappings of the arena (CUDA): reads go from the read-only one, writes to the other."""
        if self._page_locked is not None or self._arena is None:
            return
        from ..mapped.gpu_pool import page_lock_mapping  # torch: only for clients that ask for page-locking

        self._page_locked = page_lock_mapping(self._arena.buf, self._arena.size)
        if self._arena.read_buf is not None:
            self._read_locked = page_lock_mapping(self._arena.read_buf, self._arena.size, read_only=True)

    def _detach_gpu(self) -> None:
        for region in (self._page_locked, self._read_locked):
            if region is not None:
                region.unlock()
        self._page_locked = self._read_locked = None
        if self._gpu_pool is not None:
            self._gpu_pool.close()
            self._gpu_pool = None
        self._gpu_info = None

    def populate_arena(self) -> int:
        """Populate this client's whole mapping of the arena now, instead of range by range as requests first
        touch it (``pages.py``): for a client that wants its first puts and gets as fast as later ones. Returns the
        bytes of arena populated (0 without an arena, over tcp://); both mappings (read-write for puts, read-only
        for gets) are populated, which costs about 0.6 s per GiB of arena each here."""
        if self._pages is None or self._arena is None:
            return 0
        self._pages.touch(0, self._arena.size)
        if self._read_pages is not None:
            self._read_pages.touch(0, self._arena.size)
        return self._arena.size

    @property
    def arena(self) -> SharedArena | None:
        """The mapped arena, or None; another object once a restarted daemon's arena is mapped."""
        return self._arena

    @property
    def arena_view(self) -> memoryview | None:
        """The read-write view of the arena, or None."""
        return self._arena_view

    @property
    def pages(self) -> PagePopulator | None:
        """The arena's page populator, or None."""
        return self._pages

    @property
    def shared_index(self) -> SharedIndexView | None:
        """The mapped shared index of the daemon, or None."""
        return self._index

    @property
    def gpu_pool(self) -> Any:
        """The mapped GPU pool (``kvstore.mapped.gpu_pool.MappedPool``), or None."""
        return self._gpu_pool

    def _detach_arena(self) -> None:
        self._detach_gpu()   # unpin before unmapping
        for view in (self._arena_view, self._read_view):
            try:
                if view is not None:
                    view.release()
            except BufferError:
                pass  # views of live leases still point into it; the mapping goes when they do
        if self._arena is not None:
            self._arena.close()
        self._arena, self._arena_view, self._pages = None, None, None
        self._read_view, self._read_pages = None, None
