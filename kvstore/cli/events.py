"""``kvstore events``: subscribe to a daemon's KV cache events and print them as they come.

One line per event: ``seq``, the medium, the event type and its block hashes, or with ``--json`` one object per
event (``seq``, ``ts``, ``topic`` and the event's own fields as the wire has them). ``--from SEQ`` first asks the
replay socket for the batches from SEQ on (``--snapshot``: for one batch of everything held), then goes on live
without printing a batch twice; a live batch past a
gap (a batch neither received nor replayed: dropped by the publisher) is printed after a ``gap`` line. An endpoint
that accepts no connection within ``--timeout`` (a daemon not running, or not publishing there), or a replay
socket that does not answer within it, ends the command with one line and exit 1. Formats:
``protocol/kv_events.py`` and docs/operations/events.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Iterator

import msgpack
import zmq

from ..errors import ConfigError, DaemonUnavailable
from ..protocol.kv_events import END_SEQ, INCARNATION_KEY, SNAPSHOT_REQUEST, split_batch
from .flag_types import any_count, positive_seconds

TIMEOUT_S = 5.0   # the default of --timeout


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("events", help="print a daemon's KV cache events as they come",
                       description="Subscribe to the daemon's --events-endpoint and print its KV cache events "
                                   "(vLLM's format), optionally replaying missed batches first.")
    p.add_argument("--endpoint", required=True, help="the daemon's --events-endpoint (tcp:// or ipc://)")
    p.add_argument("--replay-endpoint", help="the daemon's --events-replay-endpoint (needed with --from)")
    p.add_argument("--topic", default="", help="print only messages whose topic starts with this (default: all)")
    p.add_argument("--from", dest="start", type=any_count, metavar="SEQ",
                   help="first replay the buffered batches from SEQ on (0: everything still buffered)")
    p.add_argument("--snapshot", action="store_true",
                   help="first print everything the daemon holds now (one batch), then what changes after it")
    p.add_argument("--count", type=any_count, metavar="N", help="stop after N events (default: run until interrupted)")
    p.add_argument("--json", action="store_true", help="one JSON object per event")
    p.add_argument("--timeout", type=positive_seconds, default=TIMEOUT_S, metavar="SECONDS",
                   help="how long to wait for the endpoints to accept the connection and for the replay socket "
                        "to answer; then give up with exit 1 (default: %(default)s; live events may take any time)")
    p.set_defaults(run=run)


def _check(args: argparse.Namespace) -> None:
    for flag, value in (("--endpoint", args.endpoint), ("--replay-endpoint", args.replay_endpoint)):
        if value is not None and not value.startswith(("tcp://", "ipc://")):
            raise ConfigError(f"{flag}: expected tcp://HOST:PORT or ipc://PATH, got {value!r}")
    if args.start is not None and not args.replay_endpoint:
        raise ConfigError("--from: replay needs --replay-endpoint (the daemon's --events-replay-endpoint)")
    if args.snapshot and (args.start is not None or not args.replay_endpoint):
        raise ConfigError("--snapshot: needs --replay-endpoint (the daemon's --events-replay-endpoint), and no --from")


def run(args: argparse.Namespace) -> int:
    _check(args)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt_string(zmq.SUBSCRIBE, args.topic)
    connected = sub.get_monitor_socket(zmq.EVENT_CONNECTED)   # before connecting, so the event is not missed
    sub.connect(args.endpoint)   # before the replay: nothing published meanwhile is missed
    printed = 0
    try:
        wait_connected(sub, connected, args.endpoint, args.timeout)
        stream = args.topic.encode()   # the stream replayed: that topic's (an engine's), the daemon-wide one for ""
        expected: dict[bytes, int] = {stream: args.start} if args.start is not None else {}   # next seq per topic
        if args.snapshot:
            batches = ask(ctx, args.replay_endpoint, SNAPSHOT_REQUEST, stream, args.timeout)
        elif args.start is not None:
            batches = ask(ctx, args.replay_endpoint, args.start.to_bytes(8, "big"), stream, args.timeout)
        else:
            batches = iter(())
        for topic, seq, payload in _then_live(batches, sub):
            want = expected.get(topic)
            if want is not None and seq < want:
                continue   # replayed already
            if want is not None and seq > want:
                print(f"gap: batches {want}..{seq - 1} of topic {topic.decode(errors='replace')!r} were not "
                      f"received", file=sys.stderr, flush=True)
            expected[topic] = seq + 1
            for line in format_batch(topic, seq, payload, args.json):
                print(line, flush=True)
                printed += 1
                if args.count is not None and printed >= args.count:
                    return 0
    finally:
        sub.close(linger=0)
        ctx.term()
    return 0


def wait_connected(sock: zmq.Socket, monitor: zmq.Socket, endpoint: str, timeout: float) -> None:
    """Wait until ``sock`` has connected to ``endpoint`` (``monitor``: its monitor socket for EVENT_CONNECTED,
    closed here).

    Raises:
        DaemonUnavailable: no connection within ``timeout`` seconds (nothing listens there).
    """
    try:
        if not monitor.poll(int(timeout * 1000)):
            raise DaemonUnavailable(
                f"--endpoint: nothing accepted a connection at {endpoint} within {timeout:g}s; start the daemon "
                f"with --events-endpoint {endpoint}, or pass the endpoint it publishes on (--timeout waits longer)")
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)


def _then_live(replayed: Iterator[tuple[bytes, int, bytes]],
               sub: zmq.Socket) -> Iterator[tuple[bytes, int, bytes]]:
    yield from replayed
    while True:
        topic, seq, payload = sub.recv_multipart()
        yield topic, int.from_bytes(seq, "big"), payload


def ask(ctx: zmq.Context, endpoint: str, request: bytes, topic: bytes = b"",
        timeout: float = TIMEOUT_S) -> Iterator[tuple[bytes, int, bytes]]:
    """The batches the replay socket answers ``request`` with (an 8-byte start seq: the buffered batches from it
    on; ``SNAPSHOT_REQUEST``: one batch of everything held), as (topic, seq, payload), until the end marker.
    ``topic``: the stream asked about (an engine's topic; empty: the daemon-wide stream, as vLLM's replay asks).

    Raises:
        DaemonUnavailable: the replay socket accepted no connection, or did not answer, within ``timeout`` seconds.
    """
    req = ctx.socket(zmq.DEALER)
    req.setsockopt(zmq.LINGER, 0)
    req.setsockopt(zmq.IMMEDIATE, 1)   # writable only once connected: a dead endpoint is told from a mute one
    req.connect(endpoint)
    try:
        if not req.poll(int(timeout * 1000), zmq.POLLOUT):
            raise DaemonUnavailable(
                f"--replay-endpoint: nothing accepted a connection at {endpoint} within {timeout:g}s; start the "
                f"daemon with --events-replay-endpoint {endpoint}, or pass the one it answers on")
        req.send_multipart([b"", request, *([topic] if topic else [])])
        while True:
            if not req.poll(int(timeout * 1000)):
                raise DaemonUnavailable(f"--replay-endpoint: the replay socket at {endpoint} did not answer within "
                                        f"{timeout:g}s (--timeout waits longer)")
            frames = req.recv_multipart()
            if len(frames) != 4:
                continue
            _, topic, seq, payload = frames
            if seq == END_SEQ:
                return
            yield topic, int.from_bytes(seq, "big"), payload
    finally:
        req.close(linger=0)


def format_batch(topic: bytes, seq: int, payload: bytes, as_json: bool) -> list[str]:
    """The lines ``kvstore events`` prints for one batch (a line saying what was wrong for a bad payload)."""
    try:
        ts, events, _rank = split_batch(msgpack.unpackb(payload))
    except (ValueError, msgpack.UnpackException) as exc:
        return [f"seq {seq}: undecodable batch ({exc})"]
    if as_json:
        return [json.dumps({"seq": seq, "ts": ts, "topic": topic.decode(errors="replace"), **_jsonable(e)})
                for e in events]
    when = time.strftime("%H:%M:%S", time.localtime(ts))
    return [f"{seq:>8} {when} {e['type']:<16} {e.get('medium') or '-':<8} {_hashes(e)}" for e in events]


def _hashes(event: dict[str, Any]) -> str:
    hashes = event.get("block_hashes") or []
    shown = " ".join(f"{h:016x}" if isinstance(h, int) else str(h) for h in hashes[:4])
    more = f" (+{len(hashes) - 4})" if len(hashes) > 4 else ""
    cleared = event.get("type") == "AllBlocksCleared"
    return shown + more + (f"  [incarnation {event.get(INCARNATION_KEY)}]" if cleared else "")


def _jsonable(event: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.hex() if isinstance(v, bytes) else v) for k, v in event.items()}
