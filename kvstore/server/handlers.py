"""One handler per wire operation.

A handler takes the daemon, the caller's session, the decoded header and any payload frames, and returns the
reply as a list of frames (header first). It raises a ``RequestError`` for anything the caller got wrong; the
dispatcher in ``daemon.py`` turns that into an error reply. Handlers never trust the header: every field goes
through ``protocol/messages.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .._version import __version__
from ..errors import BadRequestError, LimitError, PermissionDeniedError, VersionError
from ..protocol import messages as m
from ..protocol.wire import MAX_BATCH, PROTOCOL_VERSION, Op, ok_reply
from .session import Session

if TYPE_CHECKING:
    from .daemon import Daemon

Frames = list[Any]
Handler = Callable[["Daemon", Session, dict, list], Frames]


def handle_ping(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    return [ok_reply(h["id"])]


def handle_lookup(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    req = m.Lookup.parse(h)
    result = d.store.lookup(req.keys)
    d.count_lookup_tokens(s, len(req.keys), result.count)
    tiers: dict[str, int] = {}
    for name in result.tiers:
        tiers[name] = tiers.get(name, 0) + 1
    return [ok_reply(h["id"], count=result.count, tiers=tiers)]


def handle_reserve(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    if not s.arena:
        raise PermissionDeniedError("reserve needs the shared arena; clients over tcp:// put with PUT_INLINE")
    req = m.Reserve.parse(h, d.config.chunk_limit)
    handle, slots = d.store.reserve(s.owner, s.namespace, req.keys, req.sizes, req.parent)
    wire_slots = [None if slot is None else [slot.offset, slot.size] for slot in slots]
    return [ok_reply(h["id"], reservation=handle.id, slots=wire_slots)]


def handle_commit(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    rid = m.Handle.parse(h, "reservation").handle
    return [ok_reply(h["id"], committed=d.store.commit(s.owner, rid))]


def handle_abort(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    rid = m.Handle.parse(h, "reservation").handle
    return [ok_reply(h["id"], aborted=d.store.abort(s.owner, rid))]


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
    handle, slots = d.store.reserve(s.owner, s.namespace, keys, sizes, m.read_optional_key(h, "parent"))
    try:
        for slot, frame in zip(slots, frames):
            if slot is not None:
                d.store.host.write(slot.offset, frame.buffer if hasattr(frame, "buffer") else frame)
    except BaseException:
        d.store.abort(s.owner, handle.id)
        raise
    return [ok_reply(h["id"], committed=d.store.commit(s.owner, handle.id))]


def handle_get(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    req = m.Get.parse(h)
    handle, entries = d.store.get(s.owner, req.keys)
    if handle is None:
        return [ok_reply(h["id"], lease=0, slots=[])]
    if req.inline or not s.arena:
        # Bytes travel in frames: copy them out now and release at once, so no pin outlives this request.
        payloads = [bytes(d.store.host.read(e.host_offset, e.size)) for e in entries]
        d.store.release(s.owner, handle.id)
        return [ok_reply(h["id"], lease=0, slots=[[0, e.size] for e in entries])] + payloads
    slots = [[e.host_offset, e.size] for e in entries]
    return [ok_reply(h["id"], lease=handle.id, slots=slots, ttl=d.store.lease_ttl)]


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
    return [ok_reply(h["id"], cleared=d.store.clear())]


def handle_stats(d: "Daemon", s: Session, h: dict, frames: list) -> Frames:
    return [ok_reply(h["id"], stats=d.stats())]


HANDLERS: dict[Op, Handler] = {
    Op.PING: handle_ping,
    Op.LOOKUP: handle_lookup,
    Op.RESERVE: handle_reserve,
    Op.COMMIT: handle_commit,
    Op.ABORT: handle_abort,
    Op.PUT_INLINE: handle_put_inline,
    Op.GET: handle_get,
    Op.RELEASE: handle_release,
    Op.EXTEND: handle_extend,
    Op.DELETE: handle_delete,
    Op.CLEAR: handle_clear,
    Op.STATS: handle_stats,
}
# HELLO is handled by the daemon itself, since it creates the session.
assert set(HANDLERS) | {Op.HELLO} == set(Op), "every operation needs a handler"


def hello_reply(d: "Daemon", owner: bytes, transport: str, h: dict) -> tuple[Session, Frames]:
    req = m.Hello.parse(h)
    if req.version != PROTOCOL_VERSION:
        raise VersionError(f"client speaks protocol {req.version}, this daemon speaks {PROTOCOL_VERSION}; "
                           f"upgrade the older side")
    arena = req.want_arena and transport == "ipc"
    session = Session(owner, transport, req.namespace, req.client_id, req.chunk_tokens, arena)
    session.track_process(req.pid, req.pid_start)
    reply = {
        "version": PROTOCOL_VERSION,
        "server_version": __version__,
        "arena": {"path": d.store.host.arena.path, "size": d.store.host.arena.size} if arena else None,
        "lease_ttl": d.store.lease_ttl,
        "reserve_ttl": d.store.reserve_ttl,
        "max_batch": MAX_BATCH,
        "max_chunk": d.config.chunk_limit,
    }
    return session, [ok_reply(h["id"], **reply)]
