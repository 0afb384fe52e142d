"""The remote value format: what is accepted, and that everything else is refused."""

import pytest

from kvstore.tiers.remote import record

KEY = bytes(range(16))


def test_round_trip_and_fixed_header():
    payload = bytes(range(256)) * 10
    value = record.encode("ns", KEY, payload)
    assert len(value) == record.HEADER_SIZE + len(payload) == 64 + 2560
    assert bytes(record.decode(value, "ns", KEY)) == payload


def test_empty_payload():
    assert bytes(record.decode(record.encode("ns", KEY, b""), "ns", KEY)) == b""


@pytest.mark.parametrize("mutate", [
    pytest.param(lambda v: v[:-1], id="truncated"),
    pytest.param(lambda v: v + b"x", id="extended"),
    pytest.param(lambda v: v[:10], id="short-header"),
    pytest.param(lambda v: b"XXXX" + v[4:], id="magic"),
    pytest.param(lambda v: v[:4] + b"\x09\x00" + v[6:], id="version"),
    pytest.param(lambda v: v[:-1] + bytes([v[-1] ^ 1]), id="payload-bit"),
    pytest.param(lambda v: v[:20] + bytes([v[20] ^ 1]) + v[21:], id="checksum-bit"),
])
def test_damaged_values_are_refused(mutate):
    value = record.encode("ns", KEY, b"payload bytes" * 100)
    with pytest.raises(record.RecordError):
        record.decode(mutate(value), "ns", KEY)


def test_other_key_or_namespace_is_refused():
    value = record.encode("ns", KEY, b"abc")
    with pytest.raises(record.RecordError):
        record.decode(value, "other", KEY)
    with pytest.raises(record.RecordError):
        record.decode(value, "ns", KEY[::-1])
    with pytest.raises(record.RecordError):
        record.decode(value, "ns", KEY + b"\x00")


def test_object_names_separate_namespaces_and_keys():
    a = record.object_name("llama/bf16", KEY)
    assert a == record.object_name(b"llama/bf16", KEY)
    assert a.startswith("kvs:") and a.endswith(KEY.hex())
    assert a != record.object_name("llama/fp8", KEY)
    assert a != record.object_name("llama/bf16", KEY[::-1])


def test_key_too_long():
    with pytest.raises(ValueError):
        record.encode("ns", b"k" * 33, b"")
