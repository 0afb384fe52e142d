"""A wrong argument to any client call is a UsageError naming the argument and what it accepts, never a builtin
TypeError or ValueError from deep inside (nor a daemon's reply about a request that should not have been sent);
the client stays usable afterwards. Each case is one the client once answered with a builtin error."""

from __future__ import annotations

import pytest

import kvstore

CHUNK = 16


@pytest.fixture(scope="module")
def served(start_module_daemon):
    return start_module_daemon()


@pytest.fixture(scope="module", params=["arena", "frames"])
def c(request, served):
    """A local client that maps the arena, and one that moves bytes in frames (as over tcp://)."""
    client = served.client(namespace="x", chunk_tokens=CHUNK, use_arena=request.param == "arena")
    yield client
    client.close()


@pytest.fixture(scope="module")
def k(c):
    keys = c.chunk_keys(list(range(4 * CHUNK)))
    c.put(keys[:1], [b"a" * 1000])
    return keys


def _gen(items):
    return (item for item in items)


CLIENT_CASES = {
    # put: buffers that are not bytes-like, keys that are not keys, a generator, a bad parent
    "put-str-buffer": (lambda c, k: c.put(k[:1], ["hello"]), r"put: buffers\[0\] is a str"),
    "put-int-buffer": (lambda c, k: c.put(k[:1], [123]), r"put: buffers\[0\] is 123"),
    "put-none-buffer": (lambda c, k: c.put(k[:1], [None]), r"put: buffers\[0\] is None"),
    "put-str-key": (lambda c, k: c.put(["abc"], [b"x"]), r"put: keys\[0\] is a str .*16-byte keys"),
    "put-short-key": (lambda c, k: c.put([b"short"], [b"x"]), r"put: keys\[0\] is a bytes of 5 bytes"),
    "put-generator": (lambda c, k: c.put(k[1:2], _gen([b"y"])),
                      r"put: buffers must be a list or tuple.*list\(\.\.\.\)"),
    "put-bare-key": (lambda c, k: c.put(k[0], [b"x"]), r"put: keys must be a list or tuple.*one key"),
    "put-counts": (lambda c, k: c.put(k[:2], [b"x"]), r"put: 2 keys but 1 buffers"),
    "put-parent": (lambda c, k: c.put(k[1:2], [b"x"], parent="abc"), r"put: parent must be None or one 16-byte key"),
    # lookups
    "lookup-str": (lambda c, k: c.lookup("abc"), r"lookup: keys must be a list or tuple of 16-byte keys.*got a str"),
    "lookup-str-key": (lambda c, k: c.lookup(["abc"]), r"lookup: keys\[0\] is a str"),
    "lookup-none-key": (lambda c, k: c.lookup([None]), r"lookup: keys\[0\] is None"),
    "lookup-bare-key": (lambda c, k: c.lookup(k[0]), r"lookup: keys must be a list or tuple.*one key\?\): wrap it"),
    "lookup-none": (lambda c, k: c.lookup(None), r"lookup: keys must be a list or tuple.*None"),
    "lookup_tiers-int-key": (lambda c, k: c.lookup_tiers([1]), r"lookup_tiers: keys\[0\] is 1"),
    "lookup_many-bad-chain": (lambda c, k: c.lookup_many([k, ["abc"]]), r"lookup_many: chains\[1\]\[0\] is a str"),
    # get, get_into, read, delete
    "get-iterator": (lambda c, k: c.get(iter(k)), r"get: keys must be a list or tuple.*list_iterator"),
    "get-generator": (lambda c, k: c.get(_gen(k)), r"get: keys must be a list or tuple.*generator"),
    "get_into-none-dest": (lambda c, k: c.get_into(k[:1], [None]), r"get_into: dests\[0\] is None"),
    "get_into-str-dest": (lambda c, k: c.get_into(k[:1], ["x" * 1000]), r"get_into: dests\[0\] is a str"),
    "get_into-bytes-dest": (lambda c, k: c.get_into(k[:1], [b"x" * 1000]), r"get_into: dests\[0\]: .*writable"),
    "get_into-counts": (lambda c, k: c.get_into(k[:2], [bytearray(1000)]), r"get_into: 2 keys but 1 destinations"),
    "read-no-function": (lambda c, k: c.read(k[:1], None), r"read: copy must be a function"),
    "delete-str": (lambda c, k: c.delete("abc"), r"delete: keys must be a list or tuple"),
    # chunk_keys: token ids that are not one sequence of int64 integers
    "chunk_keys-str": (lambda c, k: c.chunk_keys("hello"), r"token_ids must be one sequence.*got str"),
    "chunk_keys-floats": (lambda c, k: c.chunk_keys([1.5] * 16), r"token_ids must be integers.*float64"),
    "chunk_keys-2**70": (lambda c, k: c.chunk_keys([2**70] * 16), r"token_ids must be integers.*beyond int64"),
    "chunk_keys-2**63": (lambda c, k: c.chunk_keys([2**63] * 16), r"token_ids must be integers.*above 2\*\*63"),
    "chunk_keys-none": (lambda c, k: c.chunk_keys(None), r"token_ids must be one sequence.*NoneType"),
    "chunk_keys-generator": (lambda c, k: c.chunk_keys(_gen(range(16))), r"token_ids must be one sequence"),
    "chunk_keys-bools": (lambda c, k: c.chunk_keys([True] * 16), r"token_ids must be integers.*bool"),
    "chunk_keys-chunk_tokens": (lambda c, k: c.chunk_keys(list(range(16)), chunk_tokens=-4), r"chunk_tokens"),
    # reserve
    "reserve-sizes": (lambda c, k: c.reserve(k[:1], [0]), r"reserve: sizes\[0\] is 0"),
    "reserve-str-size": (lambda c, k: c.reserve(k[:1], ["1000"]), r"reserve: sizes\[0\] is a str"),
    "reserve-counts": (lambda c, k: c.reserve(k[:2], [1000]), r"reserve: 2 keys but 1 sizes"),
    # scrub
    "scrub-timeout": (lambda c, k: c.scrub(timeout=0), r"scrub: timeout must be a positive"),
}


@pytest.mark.parametrize("case", sorted(CLIENT_CASES))
def test_a_wrong_argument_is_a_usage_error_naming_it(c, k, case):
    call, message = CLIENT_CASES[case]
    with pytest.raises(kvstore.UsageError, match=message) as info:
        call(c, k)
    assert isinstance(info.value, kvstore.KVStoreError)
    assert "\n" not in str(info.value)   # one line
    assert c.lookup(k[:1]) == 1   # the client goes on as before


BATCHES = {
    "2-D batch": lambda torch: torch.arange(16).reshape(2, 8),
    "3-D": lambda torch: torch.arange(16).reshape(1, 2, 8),
    "ragged": lambda torch: [[1, 2, 3], [4]],
    "nested lists": lambda torch: [list(range(8)), list(range(8))],
    "bfloat16": lambda torch: torch.ones(16, dtype=torch.bfloat16),
}


@pytest.mark.parametrize("shape", sorted(BATCHES))
def test_chunk_keys_takes_one_sequence_only(c, shape):
    torch = pytest.importorskip("torch")
    with pytest.raises(kvstore.UsageError, match=r"token_ids must be"):
        c.chunk_keys(BATCHES[shape](torch))
    with pytest.raises(kvstore.UsageError, match=r"token_ids must be"):
        kvstore.chunk_keys("x", BATCHES[shape](torch), CHUNK)


def test_chunk_keys_of_one_row_are_those_of_the_sequence(c):
    torch = pytest.importorskip("torch")
    import numpy as np

    expected = c.chunk_keys(list(range(64)))
    assert len(expected) == 4
    assert c.chunk_keys(torch.arange(64).reshape(1, 64)) == expected
    assert c.chunk_keys(torch.arange(64)) == expected
    assert c.chunk_keys(np.arange(64, dtype=np.uint32)) == expected
    assert c.chunk_keys([list(range(64))]) == expected
    assert c.chunk_keys(tuple(range(64))) == expected
    assert c.chunk_keys([]) == []


@pytest.mark.parametrize("timeout", [-1, 0, float("inf"), float("nan"), "5", None, True])
def test_connect_refuses_a_bad_timeout(served, timeout):
    with pytest.raises(kvstore.UsageError, match="connect: timeout must be a positive, finite number of seconds"):
        kvstore.connect(served.address, namespace="x", timeout=timeout)


@pytest.mark.parametrize("namespace", [None, "", 7])
def test_connect_refuses_a_bad_namespace(served, namespace):
    with pytest.raises(kvstore.UsageError, match="connect: namespace must be a non-empty string"):
        kvstore.connect(served.address, namespace=namespace)


def test_reserve_without_the_arena_is_a_usage_error(served):
    with served.client(namespace="x", chunk_tokens=CHUNK, use_arena=False) as c:
        keys = c.chunk_keys(list(range(CHUNK)))
        with pytest.raises(kvstore.UsageError, match="reserve needs the shared arena"):
            c.reserve(keys, [1000])


# Issue 40, item 5: buffers a put cannot store, and connect's chunk_tokens, are refused on the client, naming the
# call, the argument and (for a buffer) its index.
PUT_BUFFER_CASES = {
    "empty": (lambda: [b"a" * 1000, b""], r"put: buffers\[1\]: empty \(0 bytes\)"),
    "all empty": (lambda: [b""] * 2, r"put: buffers\[0\]: empty \(0 bytes\)"),
    "strided": (lambda: [b"a" * 1000, memoryview(b"b" * 2000)[::2]], r"put: buffers\[1\]: not C-contiguous"),
}


@pytest.mark.parametrize("case", sorted(PUT_BUFFER_CASES))
def test_a_buffer_put_cannot_store_is_named_with_its_index(c, k, case):
    buffers, message = PUT_BUFFER_CASES[case]
    with pytest.raises(kvstore.UsageError, match=message):
        c.put(k[1:3], buffers())
    assert c.lookup(k[:2]) == 1   # nothing was sent


def test_a_strided_numpy_buffer_is_named_with_its_index(c, k):
    np = pytest.importorskip("numpy")
    with pytest.raises(kvstore.UsageError, match=r"put: buffers\[0\]: not C-contiguous.*ascontiguousarray"):
        c.put(k[1:2], [np.zeros((100, 100), dtype=np.uint8).T])


@pytest.mark.parametrize("chunk_tokens", ["16", 16.0, 0, -1, None])
def test_connect_refuses_a_chunk_tokens_that_is_no_positive_integer(served, chunk_tokens):
    with pytest.raises(kvstore.UsageError, match=r"connect: chunk_tokens must be a positive integer; got"):
        kvstore.connect(served.address, namespace="x", chunk_tokens=chunk_tokens)


def test_no_daemon_says_how_to_start_one(tmp_path):
    path = str(tmp_path / "none.sock")
    with pytest.raises(kvstore.DaemonUnavailable) as info:
        kvstore.connect("ipc://" + path, timeout=1.0)
    assert f"no kvstore daemon is accepting requests at ipc://{path}; start one (kvstore serve --socket {path})" \
        in str(info.value)
    assert "or pass the address of a running one" in str(info.value)
