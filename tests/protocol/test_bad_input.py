"""Malformed and hostile frames get error replies, and the daemon keeps serving."""

from __future__ import annotations

import msgpack
import pytest

from kvstore.protocol.wire import Op
from support.raw_client import RawClient


@pytest.fixture
def raw(daemon):
    c = RawClient(daemon.address)
    yield c
    c.close()


def assert_alive(raw: RawClient) -> None:
    assert raw.request({"op": Op.PING, "id": 99})["ok"] is True


def test_requests_before_hello_are_refused(raw):
    r = raw.request({"op": Op.PING, "id": 5})
    assert r == {"id": 5, "ok": False, "code": 3, "error": "VersionError", "msg": r["msg"]}
    assert "HELLO" in r["msg"]


def test_wrong_protocol_version(raw):
    r = raw.request({"op": Op.HELLO, "id": 1, "version": 999, "namespace": "t"})
    assert not r["ok"] and r["error"] == "VersionError"


GARBAGE = [
    b"",
    b"\xff\xff\xff",
    b"\x93\x01",                                    # truncated array
    msgpack.packb([1, 2, 3]),                       # not a map
    msgpack.packb({"op": "lookup", "id": 1}),       # op of the wrong type
    msgpack.packb({"op": Op.PING, "id": -1}),       # bad id
    msgpack.packb({"op": 9999, "id": 1}),           # unknown op
    msgpack.packb({"op": Op.PING}),                 # no id
    msgpack.packb({1: 2}),                          # non-string keys
    b"\xdd\xff\xff\xff\xff",                        # array claiming 4 billion elements
    b"\xc6\x7f\xff\xff\xff",                        # bin claiming 2 GiB
]


@pytest.mark.parametrize("frame", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_frames_get_error_replies(raw, frame):
    raw.hello()
    raw.send(frame)
    r = raw.reply()
    assert r["ok"] is False and isinstance(r["code"], int) and r["msg"]
    assert_alive(raw)


BAD_REQUESTS = [
    {"op": Op.LOOKUP, "keys": "abc"},
    {"op": Op.LOOKUP, "keys": [b"short"]},
    {"op": Op.LOOKUP, "keys": [b"k" * 16] * 5000},                      # batch too large
    {"op": Op.LOOKUP, "keys": [b"k" * 16], "promote": "yes"},
    {"op": Op.RESERVE, "keys": [b"k" * 16], "sizes": [-1]},
    {"op": Op.RESERVE, "keys": [b"k" * 16], "sizes": [1 << 62]},         # huge size
    {"op": Op.RESERVE, "keys": [b"k" * 16], "sizes": [1, 2]},            # count mismatch
    {"op": Op.RESERVE, "keys": [b"k" * 16, b"k" * 16], "sizes": [1, 1]},  # duplicate key
    {"op": Op.RESERVE, "keys": [b"k" * 16], "sizes": [True]},
    {"op": Op.COMMIT, "reservation": 12345},                            # forged reservation
    {"op": Op.COMMIT, "reservation": -5},                               # out of range
    {"op": Op.ABORT},
    {"op": Op.RELEASE, "lease": 777},                                   # forged lease
    {"op": Op.RELEASE, "lease": "x"},
    {"op": Op.GET, "keys": []},
    {"op": Op.GET, "keys": [b"k" * 16], "wait_ms": 10**9},
    {"op": Op.DELETE, "keys": None},
    {"op": Op.PUT_INLINE, "keys": [b"k" * 16]},                         # no payload frame
]


@pytest.mark.parametrize("req", BAD_REQUESTS, ids=range(len(BAD_REQUESTS)))
def test_bad_requests_get_error_replies(raw, req):
    raw.hello()
    r = raw.request({**req, "id": 42})
    assert r["id"] == 42 and r["ok"] is False and r["error"] != "InternalError", r
    assert_alive(raw)


def test_too_many_frames_and_huge_header(raw):
    raw.hello()
    r = raw.request({"op": Op.PUT_INLINE, "id": 3, "keys": [b"k" * 16]}, b"a", b"b", b"c")
    assert not r["ok"]
    raw.send(b"\x80" + b"\x00" * (2 << 20))
    assert not raw.reply()["ok"]
    assert_alive(raw)


def test_inline_put_refused_for_empty_frame(raw):
    raw.hello(arena=False)
    r = raw.request({"op": Op.PUT_INLINE, "id": 3, "keys": [b"k" * 16]}, b"")
    assert not r["ok"] and r["error"] == "BadRequestError"


def test_stored_data_survives_bad_input(daemon, raw):
    with daemon.client(namespace="t") as c:
        keys = c.chunk_keys(list(range(512)))
        c.put(keys, [b"1" * 5000, b"2" * 7000])
        raw.hello()
        for frame in GARBAGE:
            raw.send(frame)
            raw.reply()
        for req in BAD_REQUESTS:
            raw.request({**req, "id": 1})
        with c.get(keys) as views:
            assert [bytes(v) for v in views] == [b"1" * 5000, b"2" * 7000]


def test_scrub_pass_requests_are_checked(raw):
    raw.hello()
    unknown = raw.request({"op": Op.SCRUB_STATUS, "id": 2, "pass": 12345})
    assert unknown["ok"] is False and unknown["error"] == "BadRequestError" and "no scrub pass 12345" in unknown["msg"]
    for bad in ({"pass": -1}, {"pass": "x"}, {}):
        r = raw.request({"op": Op.SCRUB_CANCEL, "id": 3, **bad})
        assert r["ok"] is False and r["error"] == "BadRequestError" and "pass" in r["msg"], r
    for keepalive in (0, 99, 10**10, "soon"):
        r = raw.request({"op": Op.SCRUB_START, "id": 4, "keepalive_ms": keepalive})
        assert r["ok"] is False and "keepalive_ms" in r["msg"], r
    started = raw.request({"op": Op.SCRUB_START, "id": 5, "rate": 0})
    assert started["ok"] is True and started["state"] in ("running", "done")
    assert raw.request({"op": Op.SCRUB_CANCEL, "id": 6, "pass": started["pass"]})["ok"] is True
    assert_alive(raw)


def test_the_scrub_operations_are_appended_not_renumbered():
    assert (Op.CREDIT_PUT, Op.SCRUB_START, Op.SCRUB_STATUS, Op.SCRUB_CANCEL) == (18, 19, 20, 21)
