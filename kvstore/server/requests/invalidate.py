"""``kvstore invalidate``: an operator drops every chunk of named namespaces from every tier the daemon holds.

What for. A model's weights changed in place, a checkpoint was rewritten, or chunks of a namespace must go for any
other reason: the connectors name a namespace after their model (``kv:MODEL`` for the format every engine reads,
``vllm:MODEL`` or ``sglang:MODEL`` for an engine's own, with a salt when one is configured), so dropping a model's
chunks is dropping its namespaces, and ``prefix`` names all of one kind at once (every salt, every layout).

What goes. Every committed chunk of each namespace, in DRAM, on disk and in the GPU tier (``Store.clear``: the
chunk leaves the index at once, its files and slots are freed, and the KV cache events name what was removed, as
for any removal); chunks a kept arena still verifies (``store/adoption.py``: dropped instead of adopted); the
remote store's values of the chunks dropped here (deleted, and not fetched again for a while should the delete
fail), and the namespace's key parameters (a client that cuts chunks otherwise is accepted from then on).

Leased chunks are invisible to lookups and gets at once and free their space when their leases end (a reader that
holds a view keeps reading the bytes it was lent). A put in flight when the request runs (reserved, not committed)
is stored when it commits. What it cannot reach: values in the remote store this daemon does not hold (evicted
here, or written by other hosts), which a later lookup may fetch back; run it on every host that shares the store,
or have the connectors move to a new namespace.

Taken only from a local client the daemon's own user runs (or root), as ``kvstore reload``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ... import logs
from ...protocol import messages as m
from ...store.entry import State

if TYPE_CHECKING:
    from .service import Service


@dataclass
class Invalidated:
    """What one INVALIDATE dropped."""

    chunks: dict[str, int] = field(default_factory=dict)   # per namespace named: committed chunks dropped
    adopting: int = 0          # chunks of a kept arena dropped before they were adopted
    remote_deleted: int = 0    # values the remote store said it removed
    remote_failed: bool = False   # the remote delete failed (the values are not fetched again for a while)

    def wire(self) -> dict[str, Any]:
        return {"chunks": self.chunks, "adopting": self.adopting, "remote_deleted": self.remote_deleted,
                "remote_failed": self.remote_failed}


def held_namespaces(svc: "Service") -> set[str]:
    """Every namespace the daemon holds chunks of (or is still adopting)."""
    held = {e.namespace for e in svc.store.index.values()}
    if svc.adoption is not None:
        held |= {c.namespace for c in svc.adoption.waiting}
    return held


def targets(req: m.Invalidate, held: set[str]) -> list[str]:
    """The namespaces ``req`` names: each name as it is, or every held namespace starting with one (``prefix``)."""
    if not req.prefix:
        return list(dict.fromkeys(req.names))
    return sorted(ns for ns in held if any(ns.startswith(p) for p in req.names))


async def invalidate(svc: "Service", req: m.Invalidate) -> Invalidated:
    """Drop every chunk of the namespaces ``req`` names from every tier (see the module docstring)."""
    store = svc.store
    done = Invalidated()
    names = targets(req, held_namespaces(svc))
    remote_keys: list[bytes] = []
    for namespace in names:
        if svc.remote is not None:
            remote_keys += [k for k, e in store.index.items()
                            if e.namespace == namespace and e.state is State.COMMITTED]
        done.chunks[namespace] = store.clear(namespace)
        store.key_params.pop(namespace, None)
    if svc.adoption is not None:
        done.adopting = svc.adoption.drop_namespaces(set(names))
    if svc.remote is not None and remote_keys:
        svc.remote.forget(remote_keys)   # never fetched back while the delete is under way, nor should it fail
        removed = await svc.remote.backend.delete_async(remote_keys)
        done.remote_failed = removed is None
        done.remote_deleted = removed or 0
    logs.info("namespaces_invalidated", namespaces=",".join(names) or "-", prefix=req.prefix,
              chunks=sum(done.chunks.values()), adopting=done.adopting, remote_deleted=done.remote_deleted,
              remote_failed=done.remote_failed)
    return done
