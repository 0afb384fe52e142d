"""One handler per wire operation.

A handler takes the service (``service.py``: store, tiers, config, counters; never the daemon), the caller's
session, the decoded header and any payload frames, and returns the
reply as a list of frames (header first), or — when it has to wait for the disk or the remote store — a coroutine
that returns them (the dispatcher awaits it without blocking other requests). It raises a ``RequestError`` for
anything the caller got wrong; the dispatcher (``lifecycle/dispatcher.py``) turns that into an error reply.
Handlers never trust the header: every field goes through ``protocol/messages.py`` (``protocol/hello.py`` for HELLO).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from ..._version import __version__
from ...errors import (PermissionDeniedError, StoreFullError,
                      UnavailableError, VersionError)
from ...protocol import messages as m
from ...protocol.hello import Hello
from ...protocol.wire import MAX_BATCH, PROTOCOL_VERSION, Op, ok_reply
from ...tenants.access import AccessCache, Principal, may_access
from ...tenants.table import TenantTable
from .integrity_handlers import INTEGRITY_HANDLERS
from .invalidate import invalidate
from .service import Service
from .session import Session


Frames = list[Any]
Handler = Callable[[Service, Session, dict, list], Any]  # Frames, or a coroutine returning Frames
PUT_WAIT_S = 2.0  # how long a put waits for write-back to catch up before failing (see tiers/disk/mover.py)


def _may_touch(svc: Service, s: Session, namespace: str) -> bool:
    """Whether the session's principal may read or change ``namespace`` (``tenants/access.py``)."""
    return svc.tenants is None or may_access(svc.tenants, s.principal, namespace)


def _require_access(svc: Service, s: Session) -> None:
    """Refuse a write, delete or clear of a namespace the session's principal is not listed for."""
    if not _may_touch(svc, s, s.namespace):
        assert svc.tenants is not None   # without a tenants table every namespace may be touched
        tenant = svc.tenants.tenant_for(s.namespace).name
        raise PermissionDeniedError(f"namespace {s.namespace!r} belongs to tenant {tenant}, which does not list "
                                    f"this client's identity; connect as a listed uid/gid or CURVE key")


def _readable(svc: Service, s: Session, keys: list) -> list:
    """The leading ``keys`` the session may read: a chunk of a namespace it may not touch, and every key after it,
    is a miss, as if it were absent.

    A forbidden chunk must cost what a miss costs (no timing side channel): the walk stops at the first key that
    is absent *or* forbidden, after the same work for either (one index probe and one access check per key), and
    the Store then walks the same all-readable prefix in both cases. The access check is the session's
    ``AccessCache``, one dict lookup for any namespace, so that it costs the same for the other tenant's namespace
    as for the session's own."""
    if svc.tenants is None:
        return keys
    may_read = _reader(svc.tenants, s)
    own = may_read(s.namespace)
    for i, key in enumerate(keys):
        namespace = svc.store.namespace_of(key)
        allowed = may_read(namespace if namespace is not None else s.namespace)
        if namespace is None or not (own and allowed):
            return keys[:i]
    return keys


def _reader(table: TenantTable, s: Session) -> AccessCache:
    """The session's read check under ``table`` (made at its first read, and again after a reload)."""
    if s.access is None or s.access.table is not table:
        s.access = AccessCache(table, s.principal)
    return s.access


def handle_ping(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    return [ok_reply(h["id"])]


def handle_lookup(svc: Service, s: Session, h: dict, frames: list) -> Any:
    req = m.Lookup.parse(h)
    keys = _readable(svc, s, req.keys)
    result = svc.store.lookup(keys)
    if req.promote:
        svc.promote_after_lookup(keys, result)
    tiers: dict[str, int] = {}
    for name in result.tiers:
        tiers[name] = tiers.get(name, 0) + 1
    remote = svc.remote
    # A walk cut short by a forbidden chunk does not ask the remote store (it would fetch what the session may not
    # read), and a fetch is never filed under a namespace the session may not touch. The remote store is asked
    # only the keys of the session's own key space (tenants/key_space.py): another tenant's records are named by
    # keys of that tenant's space, which the session cannot name.
    forbidden = len(keys) < len(req.keys) and (not _may_touch(svc, s, s.namespace)
                                               or svc.store.namespace_of(req.keys[len(keys)]) is not None)
    if remote is None or not req.promote or result.count == len(req.keys) or forbidden:
        svc.count_lookup_tokens(s, len(req.keys), result.count)
        return [ok_reply(h["id"], count=result.count, tiers=tiers)]

    async def with_remote() -> Frames:
        # The local walk missed: ask the remote store for the rest of the chain, for at most --remote-wait.
        extra = await remote.continuation(s.namespace, req.keys, result.count, svc.config.remote_wait)
        if extra:
            tiers["remote"] = extra
            svc.store.count_remote_hits(extra)
        svc.count_lookup_tokens(s, len(req.keys), result.count + extra)
        return [ok_reply(h["id"], count=result.count + extra, tiers=tiers)]
    return with_remote()


def handle_lookup_seen(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    """Lookups the client answered from the shared index: the LRU touch and the counts its own lookups make."""
    req = m.LookupSeen.parse(h)
    for asked, found, repeat in zip(req.asked, req.found, req.repeat):
        found = _not_hidden(svc, s, found)
        svc.store.note_lookup(asked, found, repeat)
        svc.count_lookup_tokens(s, asked * repeat, len(found) * repeat)
    for chain in req.read:   # gets served from the arena: the touch, the counts and the hit hooks a get makes
        svc.store.note_read(_not_hidden(svc, s, chain))
    return [ok_reply(h["id"])]


def handle_load_times(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    """How long the client's own loads took per medium (``load_costs.py``): counted into the costs a router reads."""
    svc.load_costs.add(m.LoadTimes.parse(h))
    return [ok_reply(h["id"])]


def _not_hidden(svc: Service, s: Session, keys: list) -> list:
    """The leading ``keys`` up to the first that is not held, or is held for a namespace the session may not read:
    a note names what the shared index showed, which lists only held chunks and never such a one, so a key past
    that point is not the index's (or went since) and must not touch (keep hot) or count as a hit."""
    may_read = _reader(svc.tenants, s) if svc.tenants is not None else None
    for i, key in enumerate(keys):
        namespace = svc.store.namespace_of(key)
        if namespace is None or (may_read is not None and not may_read(namespace)):
            return keys[:i]
    return keys


def _throttled(svc: Service, nbytes: int, then: Callable[[], Frames]) -> Any:
    """Run ``then`` now, or — when write-back is behind — once it has caught up (back-pressure)."""
    if not svc.write_back_behind(nbytes):
        return then()

    async def later() -> Frames:
        if not await svc.wait_for_write_back(nbytes, PUT_WAIT_S):
            queued = svc.disk_mover.queued_bytes() if svc.disk_mover is not None else 0
            raise StoreFullError(f"disk writes are behind: {queued} bytes wait for the disk; "
                                 f"retry later, or raise --disk-queue if the disk keeps up on average")
        return then()
    return later()


def handle_reserve(svc: Service, s: Session, h: dict, frames: list) -> Any:
    _require_access(svc, s)
    if not s.arena:
        raise PermissionDeniedError("reserve needs the shared arena; clients over tcp://, and other users' local "
                                    "clients, put with PUT_INLINE")
    req = m.Reserve.parse(h, svc.config.chunk_limit)
    if not req.retention.stores:   # acknowledged, nothing reserved: no slot to fill, nothing to commit
        svc.store.retention.count_no_store(len(req.keys))
        kept = req.credit if req.credit and svc.store.credits.holds(s.owner, req.credit) else 0
        return [ok_reply(h["id"], reservation=0, slots=[None] * len(req.keys), credit=kept)]
    svc.safeguards.params.stored(s.namespace, s.key_params)
    svc.store.puts.refuse_never_fitting(s.namespace, req.keys, req.sizes)   # at once, not after waiting for the disk
    return _throttled(svc, sum(req.sizes), lambda: _reserve_now(svc, s, h, req))


def _reserve_now(svc: Service, s: Session, h: dict, req: m.Reserve) -> Frames:
    handle, slots = svc.store.reserve(s.owner, s.namespace, req.keys, req.sizes, req.parent, req.credit,
                                      req.engine, req.retention)
    wire_slots = [None if slot is None else [slot.offset, slot.size] for slot in slots]
    kept = req.credit if req.credit and svc.store.credits.holds(s.owner, req.credit) else 0
    return [ok_reply(h["id"], reservation=handle.id, slots=wire_slots, credit=kept)]


def handle_commit(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    rid = m.Handle.parse(h, "reservation").handle
    return [ok_reply(h["id"], committed=svc.store.commit(s.owner, rid))]


def handle_abort(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    rid = m.Handle.parse(h, "reservation").handle
    return [ok_reply(h["id"], aborted=svc.store.abort(s.owner, rid))]


def handle_credit_put(svc: Service, s: Session, h: dict, frames: list) -> Any:
    """A put in one round trip: chunks the client copied into its credit, and the credit for its next put."""
    _require_access(svc, s)
    if not s.arena:
        raise PermissionDeniedError("put credits need the shared arena; clients over tcp://, and other users' "
                                    "local clients, put with PUT_INLINE")
    req = m.CreditPut.parse(h, svc.config.chunk_limit)
    if req.keys and not req.retention.stores:   # acknowledged, nothing published: the credit stays lent as it was
        svc.store.retention.count_no_store(len(req.keys))
        _, grant = svc.store.credits.put(s.owner, s.namespace, req.credit, [], [], [], None, req.want)
        return [ok_reply(h["id"], committed=0, **grant.wire())]
    if req.keys:
        svc.safeguards.params.stored(s.namespace, s.key_params)
    return _throttled(svc, sum(req.sizes), lambda: _credit_put_now(svc, s, h, req))


def _credit_put_now(svc: Service, s: Session, h: dict, req: m.CreditPut) -> Frames:
    committed, grant = svc.store.credits.put(s.owner, s.namespace, req.credit, req.keys, req.offsets, req.sizes,
                                             req.parent, req.want, req.engine, req.retention)
    return [ok_reply(h["id"], committed=committed, **grant.wire())]


def handle_put_inline(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    _require_access(svc, s)
    req = m.PutInline.parse(h, frames, svc.config.chunk_limit)
    if not req.retention.stores:   # acknowledged, nothing stored (payload frames, if sent, are dropped)
        svc.store.retention.count_no_store(len(req.keys))
        return [ok_reply(h["id"], committed=0)]
    svc.safeguards.params.stored(s.namespace, s.key_params)
    svc.store.puts.refuse_never_fitting(s.namespace, req.keys, req.sizes)   # at once, not after waiting for the disk
    return _throttled(svc, sum(req.sizes), lambda: _put_inline_now(svc, s, h["id"], frames, req))


def _put_inline_now(svc: Service, s: Session, request_id: Any, frames: list, req: m.PutInline) -> Frames:
    handle, slots = svc.store.reserve(s.owner, s.namespace, req.keys, req.sizes, req.parent, engine=req.engine,
                                      retention=req.retention)
    try:
        for slot, frame in zip(slots, frames):
            if slot is not None:
                svc.store.write(slot, frame.buffer if hasattr(frame, "buffer") else frame)
    except BaseException:
        svc.store.abort(s.owner, handle.id)
        raise
    return [ok_reply(request_id, committed=svc.store.commit(s.owner, handle.id))]


def handle_get(svc: Service, s: Session, h: dict, frames: list) -> Any:
    req = m.Get.parse(h)
    # A verifying reader hashes its views on the CPU: it gets DRAM copies, never GPU slots.
    gpu_ok = req.gpu and not req.verify and not req.inline and s.arena and svc.gpu_mover is not None
    # Only what the session may read is waited for: a forbidden chunk on disk is not read back for it (a miss).
    waits = svc.arrivals(_readable(svc, s, req.keys), gpu_ok, req.verify, req.wait_ms > 0)
    if waits:
        async def later() -> Frames:
            await asyncio.wait(waits, timeout=req.wait_ms / 1000)
            return _get_now(svc, s, h, req, gpu_ok)
        return later()
    return _get_now(svc, s, h, req, gpu_ok)


def _get_now(svc: Service, s: Session, h: dict, req: m.Get, gpu_ok: bool) -> Frames:
    handle, entries = svc.store.get(s.owner, _readable(svc, s, req.keys), gpu_ok)
    if handle is None:
        return [ok_reply(h["id"], lease=0, slots=[], tiers=[])]
    if req.inline or not s.arena:
        # Bytes travel in frames: copy them out now and release at once, so no pin outlives this request.
        payloads = [bytes(svc.store.read(e)) for e in entries]
        svc.store.release(s.owner, handle.id)
        return [ok_reply(h["id"], lease=0, slots=[[0, e.size] for e in entries], tiers=["host"] * len(entries),
                         **_sums(req, entries))] + payloads
    on_gpu = [gpu_ok and e.gpu_offset is not None for e in entries]
    slots = [[e.gpu_offset if g else e.host_offset, e.size] for e, g in zip(entries, on_gpu)]
    tiers = ["gpu" if g else "host" for g in on_gpu]
    return [ok_reply(h["id"], lease=handle.id, slots=slots, tiers=tiers, ttl=svc.store.lease_ttl,
                     **_sums(req, entries))]


def _sums(req: m.Get, entries: list) -> dict[str, Any]:
    """For a verifying reader, each chunk's checksum (None where it is not known yet: the reader treats that
    chunk, and the rest of the prefix, as a miss)."""
    return {"sums": [e.checksum for e in entries]} if req.verify else {}


def handle_release(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    lease = m.Handle.parse(h, "lease").handle
    return [ok_reply(h["id"], released=svc.store.release(s.owner, lease))]


def handle_extend(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    lease = m.Handle.parse(h, "lease").handle
    return [ok_reply(h["id"], ttl=svc.store.extend(s.owner, lease))]


def handle_delete(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    _require_access(svc, s)
    req = m.Keys.parse(h)
    mine = [k for k in req.keys if (ns := svc.store.namespace_of(k)) is None or _may_touch(svc, s, ns)]
    return [ok_reply(h["id"], deleted=svc.store.delete(mine))]


def handle_clear(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    _require_access(svc, s)
    return [ok_reply(h["id"], cleared=svc.store.clear(s.namespace))]   # the caller's namespace only


def handle_stats(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    return [ok_reply(h["id"], stats=svc.stats())]


def handle_reload(svc: Service, s: Session, h: dict, frames: list) -> Frames:
    """Read the config file's tenants table again and apply it, or say in one line why it was refused. Taken only
    from a local client the daemon's own user runs (or root), as its hello found (``local_access.may_map``: a
    stream connection's uid is the kernel's word, a ZeroMQ ipc one's libzmq's, else the socket's owner-only
    mode)."""
    if not s.owner_local:
        raise PermissionDeniedError("reload is taken only from a local client run by the daemon's user or root; "
                                    "run kvstore reload on the daemon's host as that user, or send it SIGHUP")
    if svc.reload is None:
        raise UnavailableError("this daemon cannot reload (it was not started by kvstore serve); restart it")
    return [ok_reply(h["id"], **svc.reload().wire())]


def handle_invalidate(svc: Service, s: Session, h: dict, frames: list) -> Any:
    """Drop every chunk of the namespaces the request names from every tier (``server/requests/invalidate.py``). Taken
    only from a local client the daemon's own user runs (or root), as ``handle_reload``."""
    if not s.owner_local:
        raise PermissionDeniedError("invalidate is taken only from a local client run by the daemon's user or "
                                    "root; run kvstore invalidate on the daemon's host as that user")
    req = m.Invalidate.parse(h)

    async def later() -> Frames:
        done = await invalidate(svc, req)
        return [ok_reply(h["id"], **done.wire())]
    return later()


HANDLERS: dict[Op, Handler] = {
    Op.PING: handle_ping,
    Op.LOOKUP: handle_lookup,
    Op.RESERVE: handle_reserve,
    Op.COMMIT: handle_commit,
    Op.ABORT: handle_abort,
    Op.PUT_INLINE: handle_put_inline,
    Op.CREDIT_PUT: handle_credit_put,
    Op.GET: handle_get,
    Op.RELEASE: handle_release,
    Op.EXTEND: handle_extend,
    Op.LOOKUP_SEEN: handle_lookup_seen,
    Op.LOAD_TIMES: handle_load_times,
    Op.DELETE: handle_delete,
    Op.CLEAR: handle_clear,
    Op.STATS: handle_stats,
    Op.RELOAD: handle_reload,
    Op.INVALIDATE: handle_invalidate,
    **INTEGRITY_HANDLERS,
}
# HELLO is handled by the daemon itself, since it creates the session.
assert set(HANDLERS) | {Op.HELLO} == set(Op), "every operation needs a handler"


def hello_reply(svc: Service, owner: bytes, transport: str, h: dict,
                principal: Principal | None = None, maps: bool = False) -> tuple[Session, Frames]:
    """The session a HELLO opens and its reply. ``maps``: whether the client may be offered the arena, the shared
    index and the GPU pool (``local_access.may_map``: the daemon's own user or root, locally); a client that may
    not is named none of them, and its puts and gets carry their bytes in the messages."""
    req = Hello.parse(h)
    if req.version != PROTOCOL_VERSION:
        raise VersionError(f"client speaks protocol {req.version}, this daemon speaks {PROTOCOL_VERSION}; "
                           f"upgrade the older side")
    arena = req.want_arena and transport == "ipc" and maps
    session = Session(owner, transport, req.namespace, req.client_id, req.chunk_tokens, arena,
                      key_scheme=req.key_scheme, hash_seed=req.hash_seed, principal=principal or Principal(),
                      owner_local=maps)
    svc.safeguards.params.check(session.namespace, session.key_params)
    session.track_process(req.pid, req.pid_start)
    session.connector = req.connector
    session.identity = req.identity
    svc.key_space(session)   # the key space its keys are mapped into from now on (tenants/key_space.py)
    if svc.event_log is not None:
        svc.event_log.note_block_size(session.namespace, session.chunk_tokens)
        if req.identity is not None and req.identity.groups:
            svc.event_log.note_groups(session.namespace, req.identity.groups)
    private = svc.tenants is not None and svc.tenants.tenant_for(session.namespace).restricted
    reply = {
        "version": PROTOCOL_VERSION,
        "server_version": __version__,
        "arena": dict(zip(("path", "size"), svc.store.arena())) if arena else None,
        # A restricted tenant's chunks are not in the shared index (store.py: private): its clients ask us.
        "index": svc.index.path if arena and svc.index is not None and not private else None,
        "stream": svc.stream_path() if arena else None,
        "gpu": svc.gpu_hello if arena and req.want_gpu else None,
        "lease_ttl": svc.store.lease_ttl,
        "reserve_ttl": svc.store.reserve_ttl,
        "max_batch": MAX_BATCH,
        "max_chunk": svc.config.chunk_limit,
        "align": svc.store.host.allocator.align,   # a put credit's chunks start at multiples of it
        "credit_max": svc.store.credits.largest,   # the largest credit lent (store/credits.py)
    }
    svc.engine_joined(session)
    return session, [ok_reply(h["id"], **reply)]
