"""One handler per wire operation.

A handler takes the daemon, the caller's session, the decoded header and any payload frames, and returns the
reply as a list of frames (header first), or — when it has to wait for the disk or the remote store — a coroutine
that returns them (the dispatcher awaits it without blocking other requests). It raises a ``RequestError`` for
anything the caller got wrong; the dispatcher in ``daemon.py`` turns that into an error reply. Handlers never
trust the header: every field goes through ``protocol/messages.py``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable

from .._version import __version__
from ..errors import BadRequestError, LimitError, PermissionDeniedError, StoreFullError, VersionError
from ..protocol import messages as m
from ..protocol.wire import MAX_BATCH, PROTOCOL_VERSION, Op, ok_reply
from .integrity_handlers import INTEGRITY_HANDLERS
from .session import Session

if TYPE_CHECKING:
    from .daemon import Daemon

Frames = list[Any]
Handler = Callable[["Daemon", Session, dict, list], Any]  # Frames, or a coroutine returning Frames
PUT_WAIT_S = 2.0  # how long a put waits for write-back to catch up before failing (see store/manager.py)


def handle_ping(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    return [ok_reply(h["id"])]


def handle_lookup(d: "Daemon", s: Session, h: dict, frames: list) -> Any:
    req = m.Lookup.parse(h)
    result = d.store.lookup(req.keys)
    if req.promote and d.manager is not None and "disk" in result.tiers:
        d.manager.promote(d.store.to_promote(req.keys))
    tiers: dict[str, int] = {}
    for name in result.tiers:
        tiers[name] = tiers.get(name, 0) + 1
    if d.remote is None or not req.promote or result.count == len(req.keys):
        d.count_lookup_tokens(s, len(req.keys), result.count)
        return [ok_reply(h["id"], count=result.count, tiers=tiers)]

    async def with_remote() -> Frames:
        # The local walk missed: ask the remote store for the rest of the chain, for at most --remote-wait.
        extra = await d.remote.continuation(s.namespace, req.keys, result.count, d.config.remote_wait)
        if extra:
            tiers["remote"] = extra
            d.store.count_remote_hits(extra)
        d.count_lookup_tokens(s, len(req.keys), result.count + extra)
        return [ok_reply(h["id"], count=result.count + extra, tiers=tiers)]
    return with_remote()


def handle_lookup_seen(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    """Lookups the client answered from the shared index: the LRU touch and the counts its own lookups make."""
    req = m.LookupSeen.parse(h)
    for asked, found in zip(req.asked, req.found):
        d.store.note_lookup(asked, found)
        d.count_lookup_tokens(s, asked, len(found))
    return [ok_reply(h["id"])]


def _throttled(d: "Daemon", nbytes: int, then: Callable[[], Frames]) -> Any:
    """Run ``then`` now, or — when write-back is behind — once it has caught up (back-pressure)."""
    if d.manager is None or not d.manager.over_bound(nbytes):
        return then()

    async def later() -> Frames:
        if not await d.manager.wait_for_room(nbytes, PUT_WAIT_S):
            raise StoreFullError(f"disk writes are behind: {d.store.dirty_bytes} bytes wait for the disk; "
                                 f"retry later, or raise --disk-queue if the disk keeps up on average")
        return then()
    return later()


def handle_reserve(d: "Daemon", s: Session, h: dict, frames: list) -> Any:
    if not s.arena:
        raise PermissionDeniedError("reserve needs the shared arena; clients over tcp:// put with PUT_INLINE")
    req = m.Reserve.parse(h, d.config.chunk_limit)
    d.safeguards.params.stored(s.namespace, s.key_params)
    return _throttled(d, sum(req.sizes), lambda: _reserve_now(d, s, h, req))


def _reserve_now(d: "Daemon", s: Session, h: dict, req: m.Reserve) -> Frames:
    handle, slots = d.store.reserve(s.owner, s.namespace, req.keys, req.sizes, req.parent)
    wire_slots = [None if slot is None else [slot.offset, slot.size] for slot in slots]
    return [ok_reply(h["id"], reservation=handle.id, slots=wire_slots)]


def handle_commit(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    rid = m.Handle.parse(h, "reservation").handle
    return [ok_reply(h["id"], committed=d.store.commit(s.owner, rid))]


def handle_abort(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    rid = m.Handle.parse(h, "reservation").handle
    return [ok_reply(h["id"], aborted=d.store.abort(s.owner, rid))]


def handle_credit_put(d: "Daemon", s: Session, h: dict, frames: list) -> Any:
    """A put in one round trip: chunks the client copied into its credit, and the credit for its next put."""
    if not s.arena:
        raise PermissionDeniedError("put credits need the shared arena; clients over tcp:// put with PUT_INLINE")
    req = m.CreditPut.parse(h, d.config.chunk_limit)
    if req.keys:
        d.safeguards.params.stored(s.namespace, s.key_params)
    return _throttled(d, sum(req.sizes), lambda: _credit_put_now(d, s, h, req))


def _credit_put_now(d: "Daemon", s: Session, h: dict, req: m.CreditPut) -> Frames:
    committed, grant = d.store.credits.put(s.owner, s.namespace, req.credit, req.keys, req.offsets, req.sizes,
                                           req.parent, req.want)
    return [ok_reply(h["id"], committed=committed, **grant.wire())]


def handle_put_inline(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    keys = m.read_keys(h)
    if len(frames) != len(keys):
        raise BadRequestError(f"PUT_INLINE carries {len(frames)} payload frames for {len(keys)} keys")
    if len(set(keys)) != len(keys):
        raise BadRequestError("field 'keys' holds the same key twice")
    sizes = [len(f) for f in frames]
    for i, size in enumerate(sizes):
        if size == 0:
            raise BadRequestError(f"payload frame {i} is empty")
        if size > d.config.chunk_limit:
            raise LimitError(f"payload frame {i} is {size} bytes; the largest chunk accepted is {d.config.chunk_limit}")
    d.safeguards.params.stored(s.namespace, s.key_params)
    return _throttled(d, sum(sizes), lambda: _put_inline_now(d, s, h, frames, keys, sizes))


def _put_inline_now(d: "Daemon", s: Session, h: dict, frames: list, keys: list, sizes: list) -> Frames:
    handle, slots = d.store.reserve(s.owner, s.namespace, keys, sizes, m.read_optional_key(h, "parent"))
    try:
        for slot, frame in zip(slots, frames):
            if slot is not None:
                d.store.host.write(slot.offset, frame.buffer if hasattr(frame, "buffer") else frame)
    except BaseException:
        d.store.abort(s.owner, handle.id)
        raise
    return [ok_reply(h["id"], committed=d.store.commit(s.owner, handle.id))]


def handle_get(d: "Daemon", s: Session, h: dict, frames: list) -> Any:
    req = m.Get.parse(h)
    # A verifying reader hashes its views on the CPU: it gets DRAM copies, never GPU slots.
    gpu_ok = req.gpu and not req.verify and not req.inline and s.arena and d.gpu_mover is not None
    waits: list[asyncio.Future] = d.safeguards.integrity.waits(req.keys) if req.verify else []
    if req.wait_ms > 0:
        if d.manager is not None:
            on_disk = d.store.to_promote(req.keys)
            if on_disk:
                waits += d.manager.promote(on_disk)
        if d.gpu_mover is not None and not gpu_ok:
            waits += d.gpu_mover.fetch_down(d.store.gpu_only(req.keys))  # this reader cannot map the GPU pool
        if d.remote is not None:
            waits += d.remote.pending(req.keys)   # chunks a lookup found in the remote store, still arriving
    waits = [w for w in waits if not w.done()]
    if waits:
        async def later() -> Frames:
            await asyncio.wait(waits, timeout=req.wait_ms / 1000)
            return _get_now(d, s, h, req, gpu_ok)
        return later()
    return _get_now(d, s, h, req, gpu_ok)


def _get_now(d: "Daemon", s: Session, h: dict, req: m.Get, gpu_ok: bool) -> Frames:
    handle, entries = d.store.get(s.owner, req.keys, gpu_ok)
    if d.gpu_mover is not None and d.store.gpu_wanted:
        d.gpu_mover.wake()
    if handle is None:
        return [ok_reply(h["id"], lease=0, slots=[], tiers=[])]
    if req.inline or not s.arena:
        # Bytes travel in frames: copy them out now and release at once, so no pin outlives this request.
        payloads = [bytes(d.store.host.read(e.host_offset, e.size)) for e in entries]
        d.store.release(s.owner, handle.id)
        return [ok_reply(h["id"], lease=0, slots=[[0, e.size] for e in entries], tiers=["host"] * len(entries),
                         **_sums(req, entries))] + payloads
    on_gpu = [gpu_ok and e.gpu_offset is not None for e in entries]
    slots = [[e.gpu_offset if g else e.host_offset, e.size] for e, g in zip(entries, on_gpu)]
    tiers = ["gpu" if g else "host" for g in on_gpu]
    return [ok_reply(h["id"], lease=handle.id, slots=slots, tiers=tiers, ttl=d.store.lease_ttl,
                     **_sums(req, entries))]


def _sums(req: m.Get, entries: list) -> dict[str, Any]:
    """For a verifying reader, each chunk's checksum (None where it is not known yet: the reader treats that
    chunk, and the rest of the prefix, as a miss)."""
    return {"sums": [e.checksum for e in entries]} if req.verify else {}


def handle_release(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    lease = m.Handle.parse(h, "lease").handle
    return [ok_reply(h["id"], released=d.store.release(s.owner, lease))]


def handle_extend(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    lease = m.Handle.parse(h, "lease").handle
    return [ok_reply(h["id"], ttl=d.store.extend(s.owner, lease))]


def handle_delete(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    req = m.Keys.parse(h)
    return [ok_reply(h["id"], deleted=d.store.delete(req.keys))]


def handle_clear(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    return [ok_reply(h["id"], cleared=d.store.clear(s.namespace))]   # the caller's namespace only


def handle_stats(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    return [ok_reply(h["id"], stats=d.stats())]


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
    Op.DELETE: handle_delete,
    Op.CLEAR: handle_clear,
    Op.STATS: handle_stats,
    **INTEGRITY_HANDLERS,
}
# HELLO is handled by the daemon itself, since it creates the session.
assert set(HANDLERS) | {Op.HELLO} == set(Op), "every operation needs a handler"


def hello_reply(d: "Daemon", owner: bytes, transport: str, h: dict) -> tuple[Session, Frames]:
    req = m.Hello.parse(h)
    if req.version != PROTOCOL_VERSION:
        raise VersionError(f"client speaks protocol {req.version}, this daemon speaks {PROTOCOL_VERSION}; "
                           f"upgrade the older side")
    arena = req.want_arena and transport == "ipc"
    session = Session(owner, transport, req.namespace, req.client_id, req.chunk_tokens, arena,
                      key_scheme=req.key_scheme, hash_seed=req.hash_seed)
    d.safeguards.params.check(session.namespace, session.key_params)
    session.track_process(req.pid, req.pid_start)
    reply = {
        "version": PROTOCOL_VERSION,
        "server_version": __version__,
        "arena": {"path": d.store.host.arena.path, "size": d.store.host.arena.size} if arena else None,
        "index": d.index.path if arena and d.index is not None else None,
        "stream": d.stream.path if arena and d.stream is not None and d.stream.listening else None,
        "gpu": d.gpu_hello if arena and req.want_gpu else None,
        "lease_ttl": d.store.lease_ttl,
        "reserve_ttl": d.store.reserve_ttl,
        "max_batch": MAX_BATCH,
        "max_chunk": d.config.chunk_limit,
        "align": d.store.host.allocator.align,   # a put credit's chunks start at multiples of it
        "credit_max": d.store.credits.largest,   # the largest credit lent (store/credits.py)
    }
    return session, [ok_reply(h["id"], **reply)]
