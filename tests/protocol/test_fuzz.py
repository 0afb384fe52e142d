"""Property-based fuzzing of the wire protocol against a live daemon.

Inputs: random frames, headers of every operation with fields of the wrong type and out of range (huge lengths
and sizes, negative and 2**64 ids), valid requests mutated byte by byte, payload frames in wrong numbers, and
sequences of lease and reservation operations in which a second client replays, forges and steals handles.
Properties: every input gets exactly one reply, an ``ok`` map or an error with a known code that is never
InternalError (a daemon bug); the daemon keeps answering pings; the pins of one client never move because of
another's requests; and the stored bytes stay exactly what was put.

``KVSTORE_FUZZ_EXAMPLES`` scales the run (``bench/fuzz.py`` runs it long); the default keeps it to ~30 s.
"""

from __future__ import annotations

import os

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore.errors import InternalError, _BY_CODE
from kvstore.protocol.wire import PROTOCOL_VERSION, Op

from harness.workload import payload_for

EXAMPLES = int(os.environ.get("KVSTORE_FUZZ_EXAMPLES", "400"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FIELDS = ["op", "id", "keys", "sizes", "parent", "reservation", "lease", "inline", "wait_ms", "promote",
          "namespace", "version", "arena", "pid", "pid_start", "chunk_tokens", "client_id"]
STATS = {"inputs": 0, "error_replies": 0, "ok_replies": 0}


class Raw:
    """A DEALER that sends whatever frames the fuzzer makes and returns the one reply."""

    def __init__(self, address: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def send(self, frames: list[bytes]) -> dict:
        self.sock.send_multipart(frames)
        assert self.sock.poll(10_000), f"no reply to {frames[:1]!r}"
        reply = self.sock.recv_multipart()
        header = msgpack.unpackb(reply[0], raw=False)
        assert isinstance(header, dict) and isinstance(header.get("ok"), bool), header
        if not header["ok"]:
            assert header["code"] in _BY_CODE and header["code"] != InternalError.code, header
            assert isinstance(header["msg"], str) and header["msg"], header
        STATS["inputs"] += 1
        STATS["ok_replies" if header["ok"] else "error_replies"] += 1
        return {**header, "_payload": reply[1:]}

    def request(self, header: dict, *payload: bytes) -> dict:
        return self.send([msgpack.packb(header, use_bin_type=True), *payload])

    def hello(self, namespace: str = "fuzz", arena: bool = True) -> None:
        r = self.request({"op": Op.HELLO, "id": 1, "version": PROTOCOL_VERSION, "namespace": namespace,
                          "arena": arena})
        assert r["ok"], r

    def ping(self) -> None:
        assert self.request({"op": Op.PING, "id": 7})["ok"]

    def close(self) -> None:
        self.sock.close(0)


@pytest.fixture(scope="module")
def fuzz_daemon(start_module_daemon):
    # Through the one fixture: its own socket, disk dir and sandbox, so the fuzzer's CLEAR and junk chunks
    # can only reach a scratch disk tier.
    d = start_module_daemon("--host-mem", "32MiB", "--max-chunk", "4MiB", "--lease-ttl", "5s",
                            "--reserve-ttl", "2s")
    yield d
    d.stop()
    assert "internal_error" not in d.log(), d.log()[-2000:]
    print("fuzz:", STATS)


@pytest.fixture(scope="module")
def raw(fuzz_daemon):
    c = Raw(fuzz_daemon.address)
    c.hello()
    yield c
    c.close()


# -- strategies ---------------------------------------------------------------------------------------------

KEY = st.binary(min_size=16, max_size=16)
INTS = st.one_of(st.integers(-(1 << 63), (1 << 64) - 1), st.sampled_from([0, -1, 1, 1 << 31, 1 << 62, (1 << 64) - 1]))
SCALAR = st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=True), st.text(max_size=40),
                   st.binary(max_size=40), KEY)
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=8),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=20)
OPS = st.one_of(st.sampled_from(list(Op)), INTS)


@st.composite
def headers(draw) -> dict:
    """A header that names a real operation (mostly) and carries plausible and implausible fields."""
    h = {"op": int(draw(OPS)), "id": draw(st.one_of(st.integers(0, 1 << 20), INTS))}
    for name in draw(st.lists(st.sampled_from(FIELDS[2:]), max_size=6, unique=True)):
        if name in ("keys",):
            h[name] = draw(st.one_of(st.lists(KEY, max_size=6), VALUE))
        elif name == "sizes":
            h[name] = draw(st.one_of(st.lists(INTS, max_size=6), st.lists(st.integers(1, 1 << 23), max_size=6),
                                     VALUE))
        else:
            h[name] = draw(VALUE)
    if draw(st.booleans()):
        h[draw(st.text(max_size=10))] = draw(VALUE)
    return h


def mutate(frame: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    data = bytearray(frame)
    for kind, pos, value in edits:
        if not data:
            break
        pos %= len(data)
        if kind == 0:
            data[pos] = value
        elif kind == 1:
            del data[pos:]
        else:
            data.insert(pos, value)
    return bytes(data)


VALID = [
    {"op": Op.LOOKUP, "id": 3, "keys": [b"k" * 16, b"j" * 16]},
    {"op": Op.RESERVE, "id": 4, "keys": [b"r" * 16], "sizes": [4096]},
    {"op": Op.GET, "id": 5, "keys": [b"k" * 16]},
    {"op": Op.RELEASE, "id": 6, "lease": 1},
    {"op": Op.PUT_INLINE, "id": 7, "keys": [b"p" * 16]},
    {"op": Op.HELLO, "id": 8, "version": PROTOCOL_VERSION, "namespace": "fuzz", "arena": True},
]


# -- properties ---------------------------------------------------------------------------------------------

@FUZZ
@given(frames=st.lists(st.binary(max_size=300), min_size=1, max_size=4))
def test_random_frames(raw, frames):
    raw.send(frames)
    raw.ping()


@FUZZ
@given(header=headers(), payload=st.lists(st.binary(max_size=2000), max_size=3))
def test_random_headers(raw, header, payload):
    raw.request(header, *payload)
    raw.ping()
    if header.get("op") == Op.HELLO:
        raw.hello()  # back to a known session for the next example


@FUZZ
@given(which=st.sampled_from(range(len(VALID))),
       edits=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1 << 16), st.integers(0, 255)),
                      min_size=1, max_size=6),
       payload=st.lists(st.binary(max_size=64), max_size=2))
def test_mutated_valid_requests(raw, which, edits, payload):
    frame = mutate(msgpack.packb(VALID[which], use_bin_type=True), edits)
    raw.send([frame, *payload])
    raw.ping()
    raw.hello()


@pytest.mark.parametrize("frame", [
    b"\xc6\xff\xff\xff\xff",                     # bin 32 claiming 4 GiB
    b"\xdb\xff\xff\xff\xff",                     # str 32 claiming 4 GiB
    b"\xdf\xff\xff\xff\xff",                     # map 32 claiming 4 billion pairs
    b"\x91" * 100_000,                           # arrays nested 100,000 deep
    msgpack.packb({"op": Op.LOOKUP, "id": 1, "keys": [b"k" * 16] * 8000}),
    msgpack.packb({"op": Op.RESERVE, "id": 1, "keys": [b"k" * 16], "sizes": [1 << 63]}),
    msgpack.packb({"op": Op.PUT_INLINE, "id": 1, "keys": [b"q" * 16]}) + b"\x00",
    b"\x80" + b"\x00" * (3 << 20),               # header past the size bound
], ids=["bin4g", "str4g", "map4g", "deep", "batch", "size", "trailing", "huge"])
def test_huge_lengths(raw, frame):
    raw.send([frame])
    raw.ping()


@FUZZ
@given(actions=st.lists(st.tuples(
    st.sampled_from(["a_get", "a_release", "a_reserve", "a_commit", "b_release", "b_extend", "b_commit",
                     "b_abort", "b_forge"]),
    st.integers(0, 1000)), min_size=1, max_size=25))
def test_handles_cannot_be_replayed_forged_or_stolen(fuzz_daemon, actions):
    a, b = Raw(fuzz_daemon.address), Raw(fuzz_daemon.address)
    try:
        a.hello("owners")
        b.hello("owners")
        keys = [bytes([i]) * 16 for i in range(1, 4)]
        payloads = [payload_for(k, 3000) for k in keys]
        a.request({"op": Op.PUT_INLINE, "id": 2, "keys": keys}, *payloads)
        live, dead, reservations, done = [], [], [], []
        for action, pick in actions:
            if action == "a_get":
                r = a.request({"op": Op.GET, "id": 10, "keys": keys})
                if r["ok"] and r["lease"]:
                    live.append(r["lease"])
            elif action == "a_release" and (live or dead):
                pool = live + dead
                lease = pool[pick % len(pool)]
                r = a.request({"op": Op.RELEASE, "id": 11, "lease": lease})
                assert r["ok"] == (lease in live), r  # a replayed release is refused
                if lease in live:
                    live.remove(lease)
                    dead.append(lease)
            elif action == "a_reserve":
                key = (pick + 100).to_bytes(2, "little") * 8
                r = a.request({"op": Op.RESERVE, "id": 12, "keys": [key], "sizes": [1024]})
                if r["ok"]:
                    reservations.append(r["reservation"])
            elif action == "a_commit" and (reservations or done):
                pool = reservations + done
                rid = pool[pick % len(pool)]
                r = a.request({"op": Op.COMMIT, "id": 13, "reservation": rid})
                if rid in done:
                    assert not r["ok"] and r["error"] == "ReservationError", r  # a replayed commit is refused
                else:
                    assert r["ok"] or r["error"] == "ReservationError", r      # (or it expired meanwhile)
                if rid in reservations:
                    reservations.remove(rid)
                    done.append(rid)
            elif action in ("b_release", "b_extend") and (live or dead):
                pool = live + dead
                op = Op.RELEASE if action == "b_release" else Op.EXTEND
                r = b.request({"op": op, "id": 14, "lease": pool[pick % len(pool)]})
                assert not r["ok"] and r["error"] == "LeaseError", r
            elif action in ("b_commit", "b_abort") and (reservations or done):
                pool = reservations + done
                op = Op.COMMIT if action == "b_commit" else Op.ABORT
                r = b.request({"op": op, "id": 15, "reservation": pool[pick % len(pool)]})
                assert not r["ok"] and r["error"] == "ReservationError", r
            elif action == "b_forge":
                forged = pick * 7919 + (1 << 40)
                for op, field in ((Op.RELEASE, "lease"), (Op.EXTEND, "lease"), (Op.COMMIT, "reservation")):
                    r = b.request({"op": op, "id": 16, field: forged})
                    assert not r["ok"], r
        # A's pins are exactly what A did; B moved nothing. The bytes are intact.
        for lease in live:
            assert a.request({"op": Op.RELEASE, "id": 17, "lease": lease})["ok"]
        for rid in reservations:
            assert a.request({"op": Op.ABORT, "id": 18, "reservation": rid})["ok"]
        r = a.request({"op": Op.GET, "id": 19, "keys": keys, "inline": True})
        assert [bytes(p) for p in r["_payload"]] == payloads
        a.ping()
    finally:
        a.close()
        b.close()


def test_daemon_still_serves_after_fuzzing(fuzz_daemon, raw):
    raw.ping()
    import kvstore
    with kvstore.connect(fuzz_daemon.address, namespace="after", timeout=5) as c:
        keys = c.chunk_keys(list(range(512)))
        c.put(keys, [payload_for(k) for k in keys])
        with c.get(keys) as views:
            assert [bytes(v) for v in views] == [payload_for(k) for k in keys]
        assert c.stats()["sessions"] >= 1
