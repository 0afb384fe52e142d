"""The lookup index published in shared memory: the table against a model, the sequence locks under a writer in
another process, and a real daemon's index against its own socket answers (eviction, disk-only chunks, keys the
table could not list, a crash, a stop)."""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import struct
import threading
import time
import uuid
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import require_native, wait_for

import kvstore
from kvstore.mapped.index_reader import SharedIndexView, packed_keys
from kvstore import native
from kvstore.native.walk import NativeWalk
from kvstore.protocol.wire import Op
from kvstore.protocol.index_layout import (DISK, EMPTY, FILE_BYTES, GPU, H_EPOCH, H_HEARTBEAT, H_SLOTS, HEADER_BYTES,
                                           HOST, MAX_PROBE, MIN_SLOTS, REMOTE, SLOT_BYTES, STALE_S, supported)
from kvstore.mapped.index_writer import PublishedIndex

pytestmark = pytest.mark.skipif(not supported(), reason="the shared index is offered on x86-64 only")


@pytest.fixture
def index_path():
    path = f"/dev/shm/kvstore-test-{os.getpid()}-{uuid.uuid4().hex[:8]}.index"
    yield path
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@pytest.fixture(params=["python", "native"])
def walk(request) -> str:
    """Which walk a reader of the table tests takes: the Python one, or the C one (``kvstore/native/walk.py``)."""
    if request.param == "native":
        require_native("index")
    return request.param


def reader_of(path: str, walk: str) -> SharedIndexView:
    reader = SharedIndexView(path)
    if walk == "python":
        reader.walk_in_python()
    else:
        assert reader.walks_in_c
    return reader


def read_mapping(path: str) -> mmap.mmap:
    """A read-only mapping of the index file at ``path``, as a reader process of its own maps it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, FILE_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


def add_to_header(path: str, word: int, delta: int) -> None:
    """Move one header word of the index at ``path`` by ``delta``, as a writer in another process would."""
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, HEADER_BYTES, flags=mmap.MAP_SHARED) as buf:
            words = memoryview(buf).cast("Q")
            words[word] = (words[word] + delta) % (1 << 64)
            words.release()
    finally:
        os.close(fd)


def colliding_keys(n: int, home: int = 7) -> list[bytes]:
    """Keys that all start probing at the same slot of any table (their low 22 bits agree)."""
    return [(home | (i << 24)).to_bytes(8, "little") + os.urandom(8) for i in range(1, n + 1)]


def expected(model: dict[bytes, int], keys: list[bytes]) -> tuple[int, dict[str, int]]:
    tiers: dict[str, int] = {}
    for n, key in enumerate(keys):
        state = model.get(key)
        if state is None:
            return n, tiers
        name = {DISK: "disk", HOST: "host", GPU: "gpu"}[state]
        tiers[name] = tiers.get(name, 0) + 1
    return len(keys), tiers


def walk_gives_up(path: str, chain: list[bytes]) -> bool:
    """Whether a reader's walk of ``chain`` (as ``native/kvstore_index.c`` walks it) probes ``MAX_PROBE`` slots for
    one of its leading keys without finding it or an empty slot, and so leaves the answer to the socket: read from
    the table itself, every tombstone and pile-up as it lies."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _gives_up(fd, chain)
    finally:
        os.close(fd)


def _gives_up(fd: int, chain: list[bytes]) -> bool:
    slots = int.from_bytes(os.pread(fd, 8, 8 * H_SLOTS), "little")
    for key in chain:
        lo, hi = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")
        slot = lo & (slots - 1)
        for _ in range(MAX_PROBE):
            _, klo, khi, state = struct.unpack("<4Q", os.pread(fd, 32, HEADER_BYTES + slot * SLOT_BYTES))
            if klo == lo and khi == hi and state in (DISK, HOST, GPU):
                break                 # found: the walk goes on to the next key
            if state == EMPTY:
                return False          # missing: the walk ends here with an answer
            slot = (slot + 1) & (slots - 1)
        else:
            return True
    return False


def test_table_matches_a_model_through_growth_tombstones_and_collisions(index_path, walk):
    writer = PublishedIndex(index_path, 16)
    reader = reader_of(index_path, walk)
    model: dict[bytes, int] = {}
    keys = [os.urandom(16) for _ in range(3 * MIN_SLOTS)] + colliding_keys(MAX_PROBE + 8)
    try:
        for round_ in range(3):
            for i, key in enumerate(keys):
                if (i + round_) % 3:
                    state = (HOST, GPU, DISK)[i % 3]
                    writer.set(key, state)
                    model[key] = state
                elif key in model:
                    writer.remove(key)
                    del model[key]
            writer.beat()   # the reader takes a view without a recent heartbeat for a dead writer
            for start in range(0, len(keys), 97):
                chain = keys[start:start + 16]
                answer = reader.lookup(chain, promote=False)
                if answer is not None:
                    assert answer == expected(model, chain)
                else:   # only where a probe ran past MAX_PROBE (mostly the colliding keys' pile-up at slot 7)
                    assert walk_gives_up(index_path, chain)
        assert writer.rebuilds >= 1 and writer.slots > MIN_SLOTS
        writer.beat()
        listed = [k for k in model if k not in writer.unlisted]
        assert all(reader.lookup([k], promote=False) == (1, expected(model, [k])[1]) for k in listed)
        assert reader.lookup([os.urandom(16)], promote=False) == (0, {})
    finally:
        reader.close()
        writer.close()


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.integers(0, 40), st.sampled_from([0, DISK, HOST, GPU])), min_size=1, max_size=200))
def test_random_changes_never_give_a_wrong_answer(index_path, walk, ops):
    pool = colliding_keys(20) + [os.urandom(16) for _ in range(21)]
    writer = PublishedIndex(index_path, 16)
    reader = reader_of(index_path, walk)
    model: dict[bytes, int] = {}
    try:
        for i, state in ops:
            key = pool[i]
            if state:
                writer.set(key, state)
                model[key] = state
            else:
                writer.remove(key)
                model.pop(key, None)
            chain = pool[max(0, i - 3):i + 3]
            writer.beat()
            assert reader.lookup(chain, promote=False) in (None, expected(model, chain))
            assert reader.lookup(chain, promote=True) in (None, expected(model, chain))
    finally:
        reader.close()
        writer.close()   # and removes the file, for the next example


def test_promoting_lookups_defer_disk_only_chunks_to_the_socket(index_path, walk):
    writer = PublishedIndex(index_path, 16)
    reader = reader_of(index_path, walk)
    a, b = os.urandom(16), os.urandom(16)
    try:
        writer.set(a, HOST)
        writer.set(b, DISK)
        assert reader.lookup([a, b], promote=False) == (2, {"host": 1, "disk": 1})
        assert reader.lookup([a, b], promote=True) is None          # the daemon must start b's promotion
        assert reader.lookup([a], promote=True) == (1, {"host": 1})
    finally:
        reader.close()
        writer.close()


def _flip_forever(path: str, a: bytes, b: bytes, ready, stop) -> None:
    """Writer process: list a, unlist it, list b in the same slot, unlist it, ... as fast as it can."""
    writer = PublishedIndex(path, 16)
    ready.set()
    try:
        while not stop.is_set():
            for _ in range(200):
                writer.set(a, HOST)
                writer.remove(a)
                writer.set(b, GPU)
                writer.remove(b)
            writer.beat()
    finally:
        writer.close()


def test_seqlock_hides_slots_torn_by_a_concurrent_writer(index_path, walk):
    home = 11
    a = (home | 1 << 40).to_bytes(8, "little") + b"\xaa" * 8     # same home slot, both halves differ
    b = (home | 2 << 40).to_bytes(8, "little") + b"\xbb" * 8
    torn = b[:8] + a[8:]     # never listed: a reader that mixed a's and b's halves would find it
    torn2 = a[:8] + b[8:]
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_flip_forever, args=(index_path, a, b, ready, stop), daemon=True)
    proc.start()
    answered = 0
    try:
        assert ready.wait(60)
        reader = reader_of(index_path, walk)
        try:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                assert reader.lookup([torn], promote=False) in (None, (0, {}))
                assert reader.lookup([torn2], promote=False) in (None, (0, {}))
                got_a = reader.lookup([a], promote=False)
                got_b = reader.lookup([b], promote=False)
                assert got_a in (None, (0, {}), (1, {"host": 1}))
                assert got_b in (None, (0, {}), (1, {"gpu": 1}))
                answered += (got_a is not None) + (got_b is not None)
        finally:
            reader.close()
        assert answered > 0
    finally:
        stop.set()
        proc.join(10)


def test_the_c_walk_reads_what_the_python_walk_reads(index_path):
    require_native("index")
    lib = native.load("index")
    writer = PublishedIndex(index_path, 16)
    reader = SharedIndexView(index_path)
    mapped = read_mapping(index_path)
    c_walk = NativeWalk(lib, mapped)
    keys = [os.urandom(16) for _ in range(2 * MIN_SLOTS)] + colliding_keys(MAX_PROBE + 4)
    try:
        for i, key in enumerate(keys):
            writer.set(key, (HOST, GPU, DISK)[i % 3], host=i * 4096 if i % 3 == 0 else None, size=100 + i)
        for key in keys[::7]:
            writer.remove(key)   # tombstones in the probe chains
        mask = writer.slots - 1
        unlisted = [[k] for k in keys if k in writer.unlisted]   # past MAX_PROBE slots from their home slot
        assert unlisted
        chains = [keys[s:s + n] for s in range(0, len(keys), 61) for n in (1, 16, 64)] + [[os.urandom(16)]]
        chains += unlisted
        answers = set()
        for chain in chains:
            packed = b"".join(chain)
            got = c_walk.walk(packed, len(chain), mask)
            assert got == reader.walk(packed, len(chain), mask)
            brief = c_walk.walk(packed, len(chain), mask, detail=False)
            assert brief == (got if not isinstance(got, tuple) else (*got[:3], [], [], [], []))
            answers.add(type(got).__name__ if not isinstance(got, tuple) else ("missed" if got[0] else "all"))
        assert {"missed", "all", "NoneType"} <= answers   # misses, whole chains, and chains probed past the bound
    finally:
        c_walk.close()
        mapped.close()
        reader.close()
        writer.close()



def test_the_c_lookup_answers_every_header_state_as_the_python_one(index_path):
    """``NativeWalk.lookup`` does the header's checks in C: a rebuild in progress, a closed or stale view, and the
    promote rule (disk-only chunks, a remote tier below a walk that stops short) answer as in Python."""
    require_native("index")
    writer = PublishedIndex(index_path, 16)
    readers = {walk: reader_of(index_path, walk) for walk in ("python", "native")}
    host, disk, absent = os.urandom(16), os.urandom(16), os.urandom(16)
    chains = [[host], [host, disk], [host, absent], [disk], [absent]]

    def answers() -> list:
        return [[r.try_lookup(packed_keys(chain), len(chain), promote) for chain in chains for promote in (False, True)]
                for r in readers.values()]

    try:
        writer.set(host, HOST)
        writer.set(disk, DISK)
        writer.beat()
        python, c = answers()
        assert python == c and (1, [0, 0, 0, 1, 0]) in c and None in c
        assert all(r.lookup([host, b"short"], False) is None for r in readers.values())   # a key not of 16 bytes
        writer.set_flag(REMOTE)
        python, c = answers()
        assert python == c and c[5] is None and c[4] == (1, [0, 0, 0, 1, 0])   # stopped short, promote: ask
        writer.set_flag(REMOTE, False)
        add_to_header(index_path, H_EPOCH, 1)           # a rebuild in progress: try again
        assert answers() == [[False] * 10] * 2
        add_to_header(index_path, H_EPOCH, 1)
        add_to_header(index_path, H_HEARTBEAT, -int(2 * STALE_S * 1e9))   # a stuck writer: ask the socket
        assert answers() == [[None] * 10] * 2
        writer.beat()
        writer.close_to_readers()
        assert answers() == [[None] * 10] * 2
    finally:
        for r in readers.values():
            r.close()
        writer.close()


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.one_of(
    st.lists(st.tuples(st.integers(0, 79), st.sampled_from([DISK, HOST, GPU]), st.integers(0, 3)), max_size=40),
    st.integers(0, 79)), min_size=1, max_size=40))
def test_the_c_placement_writes_the_table_the_python_writer_writes(index_path, ops):
    """Batches of sets (new keys, keys listed already, a key twice, keys past MAX_PROBE) and removes, given to a
    writer placing new keys in C and to one placing them in Python: the two tables stay byte for byte the same."""
    require_native("index")
    pool = colliding_keys(MAX_PROBE + 8) + [os.urandom(16) for _ in range(80 - MAX_PROBE - 8)]
    c_writer = PublishedIndex(index_path, 16)
    py_writer = PublishedIndex(index_path + ".py", 16)
    py_writer.place_in_python()
    assert c_writer.places_in_c
    try:
        for op in ops:
            for writer in (c_writer, py_writer):
                if isinstance(op, int):
                    writer.remove(pool[op])
                else:
                    writer.set_many([(pool[i], state, None if host == 0 else host * 4096, 1000 + i)
                                     for i, state, host in op])
            assert c_writer.slots == py_writer.slots and c_writer.tombstones == py_writer.tombstones
            assert c_writer.placement() == py_writer.placement() and c_writer.unlisted == py_writer.unlisted
            assert c_writer.table_bytes() == py_writer.table_bytes()
        reader = reader_of(index_path, "python")
        c_writer.beat()
        try:   # and what the C writer listed is what a reader finds
            for key in c_writer.placement():
                assert reader.lookup([key], promote=False)[0] == 1
        finally:
            reader.close()
    finally:
        c_writer.close()
        py_writer.close()


# -- against a real daemon ------------------------------------------------------------------------------------

@contextmanager
def both(daemon):
    """A client that reads the shared index and one that always asks the socket."""
    shm = daemon.client(namespace="si", chunk_tokens=4)
    sock = daemon.client(namespace="si", chunk_tokens=4, shared_index=False)
    try:
        assert shm.shared_index is not None and sock.shared_index is None
        yield shm, sock
    finally:
        shm.close()
        sock.close()


def test_daemon_index_agrees_with_the_socket_through_puts_deletes_and_eviction(start_daemon):
    d = start_daemon("--host-mem", "8MiB", "--disk-size", "0")
    with both(d) as (shm, sock):
        chains = [shm.chunk_keys(list(range(i * 1000, i * 1000 + 4 * 6))) for i in range(40)]
        for i, chain in enumerate(chains):
            shm.put(chain, [bytes([i]) * (64 << 10)] * len(chain))     # 40 × 384 KiB: evicts along the way
            if i % 5 == 4:
                sock.delete(chains[i - 2][3:])
            for other in chains[: i + 1]:
                want = sock.lookup_tiers(other, promote=False)
                assert shm.lookup_tiers(other, promote=False) == want
                assert shm.lookup_tiers(other) == want
        assert shm.shared_index.answered > 0 and shm.shared_index.deferred == 0
        stats = sock.stats()
        assert stats["counters"]["lookups"] >= 2 * 40


def test_lookups_from_the_index_keep_the_chain_warm(start_daemon):
    d = start_daemon("--host-mem", "4MiB", "--disk-size", "0")
    with both(d) as (shm, sock):
        size = 256 << 10
        warm = shm.chunk_keys(list(range(4 * 4)))
        cold = shm.chunk_keys(list(range(100, 100 + 4 * 4)))
        shm.put(warm, [b"w" * size] * 4)
        shm.put(cold, [b"c" * size] * 4)
        for _ in range(3):
            assert shm.lookup(warm) == 4          # from the index: only the LOOKUP_SEEN note touches the chain
        fill = shm.chunk_keys(list(range(200, 200 + 4 * 10)))
        shm.put(fill, [b"f" * size] * 10)          # 10 more chunks in a 16-chunk tier: the 2-4 oldest go
        assert sock.lookup(warm) == 4, "the chain looked up last must outlive the one never looked up"
        assert sock.lookup(cold) < 4            # the cold chain lost its deepest chunks


def test_disk_only_chunks_are_looked_up_over_the_socket_which_promotes_them(start_daemon):
    d = start_daemon("--host-mem", "4MiB", "--disk-size", "64MiB")
    with both(d) as (shm, sock):
        size = 256 << 10
        first = shm.chunk_keys(list(range(4 * 4)))
        shm.put(first, [b"1" * size] * 4)
        assert wait_for(lambda: sock.stats()["counters"].get("disk_writes", 0) >= 4)
        for i in range(1, 6):   # push the first chain out of DRAM (it stays on disk)
            more = shm.chunk_keys(list(range(i * 1000, i * 1000 + 4 * 4)))
            shm.put(more, [b"m" * size] * 4)
            assert wait_for(lambda: sock.stats()["disk"] is None or sock.stats()["disk"].get("queued_bytes", 0) == 0,
                            timeout=5)
        assert "disk" in sock.lookup_tiers(first, promote=False).tiers
        deferred = shm.shared_index.deferred
        result = shm.lookup_tiers(first)               # promoting: the socket answers and starts the reads
        assert result.count == 4 and shm.shared_index.deferred == deferred + 1
        assert wait_for(lambda: shm.lookup_tiers(first, promote=False).tiers.get("host", 0) == 4)
        with shm.get(first) as views:
            assert [bytes(v[:1]) for v in views] == [b"1"] * 4


def test_keys_the_table_cannot_list_are_answered_by_the_socket(start_daemon):
    d = start_daemon("--disk-size", "0")
    with both(d) as (shm, _sock):
        keys = colliding_keys(MAX_PROBE + 6)
        for key in keys:
            shm.put([key], [b"k" * 4096])
        deferred = shm.shared_index.deferred
        assert all(shm.lookup([key]) == 1 for key in keys)
        assert shm.shared_index.deferred > deferred   # the last ones past MAX_PROBE: not listed, asked over the socket
        assert shm.lookup(keys[-1:] + [os.urandom(16)]) == 1


def test_a_crashed_daemon_stops_answering_from_its_index(start_daemon):
    d = start_daemon("--disk-size", "0")
    c = d.client(namespace="si", chunk_tokens=4, timeout=1.0)
    keys = c.chunk_keys(list(range(4 * 8)))
    c.put(keys, [b"x" * 4096] * 8)
    errors: list[BaseException] = []
    answers: list[tuple[float, int]] = []
    stop = threading.Event()
    reader = kvstore.connect(d.address, namespace="si", chunk_tokens=4, timeout=0.3)

    def read_loop() -> None:
        while not stop.is_set():
            try:
                answers.append((time.monotonic(), reader.lookup(keys)))
            except kvstore.DaemonUnavailable:
                answers.append((time.monotonic(), -1))
            except BaseException as exc:   # noqa: BLE001 - anything else is a failure of the test
                errors.append(exc)
                return

    thread = threading.Thread(target=read_loop)
    thread.start()
    try:
        assert wait_for(lambda: len(answers) > 0)   # the reader is reading
        d.kill()
        killed = time.monotonic()
        # answers taken past the index's staleness window: a dead daemon's index answers none of them
        assert wait_for(lambda: sum(t > killed + STALE_S + 0.1 for t, _ in answers) >= 3, 30)
        stop.set()
        thread.join(10)
        assert not errors, errors
        late = [n for t, n in answers if t > killed + 0.05]
        assert late and all(n == -1 for n in late), "a dead daemon's index must not answer (its stream closed)"
        d.start()                                   # a new daemon on the same socket: a new, empty index
        assert wait_for(lambda: _lookup_or_none(c, keys) == 0, timeout=10)
        assert c.shared_index is not None and c.shared_index.lookup(keys, True) == (0, {})
    finally:
        stop.set()
        reader.close()
        c.close()


def _lookup_or_none(client, keys):
    try:
        return client.lookup(keys)
    except kvstore.DaemonUnavailable:
        return None


def test_a_stopping_daemon_refuses_lookups_as_before(start_daemon):
    d = start_daemon("--disk-size", "0", "--shutdown-timeout", "3s")
    c = d.client(namespace="si", chunk_tokens=4, timeout=2.0)
    keys = c.chunk_keys(list(range(4 * 2)))
    c.put(keys, [b"x" * 4096] * 2)
    assert c.lookup(keys) == 2 and c.shared_index.answered
    rid = c.transport.send({"op": Op.RESERVE, "keys": [os.urandom(16)], "sizes": [4096]})
    c.transport.wait(rid)                            # an open reservation holds the daemon in its stop sequence
    d.proc.send_signal(15)
    assert wait_for(lambda: c.shared_index.stale(), timeout=5)
    with pytest.raises((kvstore.UnavailableError, kvstore.DaemonUnavailable)):
        c.lookup(keys)
    c.close()
