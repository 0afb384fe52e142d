"""Compatibility of a client's keys with what the daemon holds for its namespace, checked at hello.

Two clients of one namespace that cut chunks at different sizes, derive keys by another scheme or seed their
hash differently compute keys that never meet: each stores its own copy of every prefix and finds none of the
other's, which looks like a cold cache ("zero hits") and is the most reported failure of shared KV caches. The
daemon remembers, per namespace, the key parameters of the clients that stored its chunks, and refuses a client
whose parameters differ while chunks stored under the old ones are still held, with ``IncompatibleError``
naming both sides. Once nothing of the namespace is held any more, a client with new parameters is accepted and
they become the namespace's.

The parameters outlive a restart: every record the daemon keeps of a chunk carries its namespace's (a kept arena's
description and the journal, ``tiers/host/description.py``; a disk file's header, ``tiers/disk/format.py``), and a
start fills them in from what it adopts (``Store.key_params``) before it serves, chunks still being verified
counting as held. A record without them (written before they were kept) leaves its namespace unknown: the first
client to store chunks in it names them again.

Cost: a dict lookup per hello and per put; the scan for chunks still held runs only when parameters differ.
"""

from __future__ import annotations

from typing import Callable

from ...errors import IncompatibleError
from ...protocol.key_params import KeyParams

__all__ = ["KeyParams", "NamespaceParams"]


class NamespaceParams:
    def __init__(self, holds_chunks: Callable[[str], bool], params: dict[str, KeyParams] | None = None) -> None:
        """Args:
            holds_chunks: whether chunks of a namespace are held (or still being adopted).
            params: the parameters known per namespace, shared with the Store, which writes them into every
                record of a chunk and fills them in from what a restart finds (kept arena, journal, disk).
        """
        self._params: dict[str, KeyParams] = params if params is not None else {}
        self._holds_chunks = holds_chunks

    def check(self, namespace: str, params: KeyParams) -> None:
        """Raise IncompatibleError when ``params`` differ from those of chunks held for ``namespace``."""
        known = self._params.get(namespace)
        if known is None or known == params:
            return
        if not self._holds_chunks(namespace):
            del self._params[namespace]
            return
        raise IncompatibleError(f"namespace {namespace!r}: this client uses " + "; ".join(known.differences(params))
                                + ". Its keys would never match the stored ones: use the same settings as the "
                                  "clients that stored them, or another namespace")

    def stored(self, namespace: str, params: KeyParams) -> None:
        """A client with ``params`` stored chunks of ``namespace``: check, and remember the first to do so."""
        self.check(namespace, params)
        self._params.setdefault(namespace, params)
