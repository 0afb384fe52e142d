"""Wire protocol, version 1.

Transport: ZeroMQ DEALER (client) → ROUTER (daemon), over ``ipc://`` or ``tcp://``. A message is a multipart
ZeroMQ message whose first frame is a msgpack map (the header) and whose further frames, if any, are raw chunk
payloads (only when bytes travel inline, i.e. for clients without the shared-memory arena).

Request header:  ``{"op": <Op>, "id": <uint64>, ...arguments}``
Reply header:    ``{"id": <same>, "ok": true, ...results}`` or
                 ``{"id": <same>, "ok": false, "code": <int>, "error": <name>, "msg": <text>}``

Requests are matched to replies by ``id`` alone, so a client may have many requests in flight and the daemon
may answer them out of order. The first request of a connection must be HELLO (protocol version, namespace,
client id); every other request before it gets a VersionError reply.

Keys travel either as a list of 16-byte bins or packed into one bin of 16 × n bytes (the client's form on the hot
operations: one msgpack object instead of n, cheaper to encode, decode and validate).

Adding an operation: append a new member to ``Op`` (never renumber or reuse a value), add its argument schema
to ``kvstore/protocol/messages.py``, its handler in ``kvstore/server/requests/handlers.py``, and a client method.
Error codes live in ``kvstore/errors.py`` and are append-only too.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import msgpack

from ..errors import BadRequestError, LimitError, RequestError, UnknownOpError, error_name

PROTOCOL_VERSION = 1

# Bounds on what the daemon accepts from the wire; a message past them gets a LimitError reply.
MAX_HEADER_BYTES = 1 << 20
MAX_BATCH = 4096
MAX_FRAMES = MAX_BATCH + 1


class Op(enum.IntEnum):
    """Operation codes. Append-only."""

    HELLO = 1           # first on every connection: version, namespace and key parameters; the arena and index to map
    PING = 2            # liveness
    LOOKUP = 3          # how many leading chunks of a chain are stored, where; pins nothing, may start promotions
    RESERVE = 4         # allocate slots for chunks a writer will copy in (two-phase put)
    COMMIT = 5          # publish reserved slots once written
    ABORT = 6           # give reserved slots back unwritten
    GET = 7             # lease the stored prefix of a chain: slots in the arena (ipc://) or the bytes inline (tcp://)
    RELEASE = 8         # end a lease
    DELETE = 9          # drop chunks by key
    STATS = 10          # the daemon's tiers, counters and settings
    CLEAR = 11          # drop every chunk of the client's namespace
    PUT_INLINE = 12     # a put with the bytes in the message (tcp://, clients without the arena)
    EXTEND = 13         # push a lease's deadline back
    SCRUB = 14          # check every copy of every chunk now (kvstore scrub)
    VERIFY = 15         # a connector compared computed KV with stored chunks: counts, and what to drop
    CORRUPT = 16        # a client's view failed its checksum: the daemon checks the chunk itself
    LOOKUP_SEEN = 17   # lookups a client answered from the shared index: touch and count them (mapped/index_reader.py)
    CREDIT_PUT = 18    # publish chunks copied into a put credit, lend the next one (store/credits.py)
    SCRUB_START = 19   # start a scrub pass and answer at once with its id (server/requests/scrub_passes.py)
    SCRUB_STATUS = 20  # a pass's progress, its report once ended; keeps the pass alive
    SCRUB_CANCEL = 21  # stop one scrub pass, or (pass 0) every pass clients started
    RELOAD = 22        # read the config file's tenants table again and apply it (server/requests/reload.py)
    LOAD_TIMES = 23    # how long a client's own loads took per medium, for routers (server/requests/load_costs.py)
    INVALIDATE = 24    # an operator drops namespaces' chunks from every tier (server/requests/invalidate.py)


def _check_unique_ops() -> None:
    values = [op.value for op in Op]
    assert len(values) == len(set(values)), "Op values must be unique"


_check_unique_ops()


def encode(header: dict[str, Any]) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def decode_header(raw: bytes | memoryview) -> dict[str, Any]:
    """Decode and bound one header frame; anything malformed raises BadRequestError or LimitError."""
    if len(raw) > MAX_HEADER_BYTES:
        raise LimitError(f"header frame of {len(raw)} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(
            raw, raw=False, strict_map_key=True, use_list=True,
            max_bin_len=MAX_HEADER_BYTES, max_str_len=1 << 16,
            max_array_len=2 * MAX_BATCH, max_map_len=64, max_ext_len=0,
        )
    except ValueError as exc:
        if "exceeds max" in str(exc):
            raise LimitError(_bound_message(str(exc))) from exc
        raise BadRequestError(f"header frame is not a valid msgpack message: {exc}") from exc
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, TypeError) as exc:
        raise BadRequestError(f"header frame is not a valid msgpack message: {exc}") from exc
    if not isinstance(header, dict):
        raise BadRequestError(f"header must be a msgpack map, got {type(header).__name__}")
    return header


HINT_BYTES = 1 << 16   # of a request too large to read: the head that is kept to find its id and op in


def header_hints(raw: bytes | memoryview) -> tuple[int | None, int | None]:
    """The ``id`` and ``op`` of a header that ``decode_header`` refused (too large, too many keys), found by
    skipping over the other fields without building them (or a truncated head of it: clients send ``id`` first);
    None for either that is not there or not an unsigned 64-bit integer. Lets the refusal be answered to the
    request that waits for it rather than to nobody."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(raw), 1), max_str_len=64, max_bin_len=64,
                                max_array_len=0, max_map_len=0, max_ext_len=0)
    found: dict[str, Any] = {}
    try:
        unpacker.feed(raw)
        for _ in range(min(unpacker.read_map_header(), 64)):
            name = unpacker.unpack()
            if name in ("id", "op") and name not in found:
                found[name] = unpacker.unpack()
                if len(found) == 2:
                    break
            else:
                unpacker.skip()
    except Exception:  # noqa: BLE001 - malformed or truncated: what was found so far is all there is
        pass
    return _uint64(found.get("id")), _uint64(found.get("op"))


def _uint64(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value < 1 << 64 else None


def _bound_message(reason: str) -> str:
    """msgpack's "N exceeds max_array_len(M)" said in the protocol's terms."""
    found = re.match(r"(\d+) exceeds max_array_len\((\d+)\)", reason)
    if found:
        return (f"the header holds a list of {found[1]} items, more than {found[2]}; a request carries at most "
                f"{MAX_BATCH} keys")
    return f"header frame exceeds a protocol bound: {reason}"


def request_id_of(header: dict[str, Any]) -> int:
    rid = header.get("id")
    if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid < 1 << 64:
        raise BadRequestError("field 'id' must be an unsigned 64-bit integer")
    return rid


_OPS = {op.value: op for op in Op}   # a dict lookup: calling the enum costs about a microsecond a request


def op_of(header: dict[str, Any]) -> Op:
    op = header.get("op")
    if not isinstance(op, int) or isinstance(op, bool):
        raise BadRequestError("field 'op' must be an integer operation code")
    known = _OPS.get(op)
    if known is None:
        raise UnknownOpError(f"unknown operation code {op}; this daemon speaks protocol {PROTOCOL_VERSION}")
    return known


def ok_reply(rid: int, **results: Any) -> bytes:
    return encode({"id": rid, "ok": True, **results})


def error_reply(rid: int | None, exc: RequestError) -> bytes:
    return encode({"id": rid, "ok": False, "code": exc.code, "error": error_name(exc), "msg": exc.message or str(exc)})
