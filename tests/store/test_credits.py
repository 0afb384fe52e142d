"""Put credits (store/credits.py, client/credit.py): a put in one round trip, and every guarantee of the two-phase
put kept: offsets from the wire checked against the credit, credits reclaimed when their writer dies or their
deadline passes, readers never see a credit's bytes, eviction never hands out lent space."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading

from conftest import wait_for
from support.raw_client import RawClient

import kvstore
from kvstore.protocol.wire import Op

PAGE = 4096


def _chunks(n: int, size: int, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    return [rnd.randbytes(size + i * 100) for i in range(n)]


def _credit_stats(c: kvstore.Client) -> dict:
    return c.stats()["credits"]


def test_a_put_with_a_credit_costs_one_round_trip_and_reads_back(daemon):
    with daemon.client(namespace="t") as new, daemon.client(namespace="t", credits=False) as old:
        for i, c in enumerate((new, old)):
            c.put(c.chunk_keys([i] * 256 * 4), _chunks(4, 9000, i))   # the first put takes the credit
        requests = {}
        for i, c in enumerate((new, old)):
            keys = c.chunk_keys([10 + i] * 256 * 4)
            data = _chunks(4, 9000, i)
            before = c.stats()["requests"]
            assert c.put(keys, data, parent=None) == 4
            requests[c is new] = c.stats()["requests"] - before
            with c.get(keys) as views:
                assert [bytes(v) for v in views] == data
        assert requests[True] == requests[False] - 1 == 2   # the put and the stats call; reserve + commit: three
        assert _credit_stats(new)["puts"] >= 2 and _credit_stats(new)["active"] == 1


def test_keys_already_stored_are_skipped_and_the_chain_keeps_its_parent(daemon):
    with daemon.client(namespace="t") as c:
        keys = c.chunk_keys(list(range(256 * 6)))
        data = _chunks(6, 7000, 1)
        assert c.put(keys[:3], data[:3]) == 3
        assert c.put(keys[2:], data[2:], parent=keys[1]) == 3   # keys[2] is stored: its slot goes back
        with c.get(keys) as views:
            assert [bytes(v) for v in views] == data
        assert c.put(keys, data) == 0
        assert c.stats()["tiers"]["host"]["chunks"] == 6


def _raw_with_credit(address: str, want: int) -> tuple[RawClient, dict]:
    raw = RawClient(address)
    assert raw.hello()["ok"]
    reply = raw.request({"op": Op.CREDIT_PUT, "id": 2, "credit": 0, "keys": b"", "want": want})
    assert reply["ok"] and reply["credit"] and reply["size"] >= want, reply
    return raw, reply


def test_offsets_outside_the_credit_are_refused_and_change_nothing(daemon):
    """Fuzz-style: random layouts, most of them wrong; each wrong one gets an error reply naming the field, and
    nothing is published, freed or lent differently; a right one afterwards still works."""
    raw, credit = _raw_with_credit(daemon.address, 16 * PAGE)
    other, foreign = _raw_with_credit(daemon.address, 4 * PAGE)
    rnd = random.Random(17)
    base, size, cid = credit["offset"], credit["size"], credit["credit"]
    try:
        with daemon.client(namespace="t", use_arena=False) as probe:   # the raw clients' namespace (keys bound to it)
            used = probe.stats()["tiers"]["host"]["used_bytes"]
            candidates = [base - PAGE, base + size, base + size - PAGE + 1, base + 1, base + PAGE // 2, 0,
                          1 << 47, -1, foreign["offset"]]
            for n in range(300):
                count = rnd.randint(1, 3)
                keys = [os.urandom(16) for _ in range(count)]
                offsets = [base + rnd.randrange(0, size, PAGE) for _ in range(count)]
                sizes = [rnd.randint(1, 3 * PAGE) for _ in range(count)]
                bad = rnd.randrange(6)
                if bad == 0:
                    offsets[rnd.randrange(count)] = rnd.choice(candidates)
                elif bad == 1:
                    sizes[-1] = size + PAGE           # runs past the credit's end
                    offsets[-1] = base + size - PAGE
                elif bad == 2:
                    offsets = [base] * count if count > 1 else [base + size]   # overlapping, or at the end
                elif bad == 3:
                    offsets = sorted(offsets, reverse=True) if count > 1 else [base - 1]
                elif bad == 4:
                    sizes[0] = rnd.choice([0, -5, "x", None, 2 ** 62])
                else:
                    offsets = offsets[:-1] if count > 1 else "nope"
                header = {"op": Op.CREDIT_PUT, "id": 100 + n, "credit": rnd.choice([cid, foreign["credit"]]),
                          "keys": b"".join(keys), "offsets": offsets, "sizes": sizes, "want": size}
                reply = raw.request(header)
                if reply["ok"]:   # a random layout that happened to be valid: put it back as it was
                    assert reply["committed"] == count
                    assert probe.delete(keys) == count
                    base, size, cid = reply["offset"], reply["size"], reply["credit"]
                    continue
                assert reply["code"] in (kvstore.BadRequestError.code, kvstore.ReservationError.code,
                                         kvstore.LimitError.code), reply
                assert reply["msg"]
            stats = probe.stats()
            assert stats["chunks"] == 0 and stats["tiers"]["host"]["used_bytes"] == used
            assert stats["credits"]["active"] == 2
            keys = [os.urandom(16), os.urandom(16)]
            reply = raw.request({"op": Op.CREDIT_PUT, "id": 999, "credit": cid, "keys": b"".join(keys),
                                 "offsets": [base, base + 2 * PAGE], "sizes": [PAGE + 1, 10], "want": PAGE})
            assert reply["ok"] and reply["committed"] == 2
    finally:
        raw.close()
        other.close()


def test_a_credit_is_taken_back_at_its_deadline(start_daemon):
    d = start_daemon("--reserve-ttl", "0.5s")
    raw, credit = _raw_with_credit(d.address, 8 * PAGE)   # no pid at hello: the daemon cannot follow it
    try:
        with d.client(namespace="probe", use_arena=False) as probe:
            assert wait_for(lambda: probe.stats()["credits"]["active"] == 0, 5)
            assert probe.stats()["credits"]["expired"] == 1 and probe.stats()["credits"]["lent_bytes"] == 0
        reply = raw.request({"op": Op.CREDIT_PUT, "id": 3, "credit": credit["credit"], "keys": os.urandom(16),
                             "offsets": [credit["offset"]], "sizes": [100], "want": 0})
        assert not reply["ok"] and reply["code"] == kvstore.ReservationError.code
    finally:
        raw.close()


def test_a_dead_writers_credit_is_reclaimed(daemon):
    script = textwrap.dedent(f"""
        import os, sys, time, kvstore
        c = kvstore.connect({daemon.address!r}, namespace="t")
        c.put(c.chunk_keys(list(range(256))), [os.urandom(1 << 20)])
        print("held", flush=True)
        time.sleep(60)   # the point: a writer that holds its credit until the test kills it
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with daemon.client(namespace="t", use_arena=False) as probe:   # the raw clients' namespace (keys bound to it)
            assert probe.stats()["credits"]["active"] == 1
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert wait_for(lambda: probe.stats()["credits"]["active"] == 0, 5)
            assert probe.stats()["credits"]["lent_bytes"] == 0
            assert probe.stats()["chunks"] == 1
    finally:
        proc.kill()
        proc.wait()


def test_concurrent_writers_each_read_back_their_own_bytes(daemon):
    errors: list[BaseException] = []
    shared = daemon.client(namespace="t")   # one client from several threads too: the credit is never shared

    def writer(n: int, own: bool) -> None:
        try:
            c = daemon.client(namespace="t") if own else shared
            for r in range(15):
                keys = c.chunk_keys([n, r] * 128 * 3)
                data = _chunks(3, 3000 + 1000 * n, 100 * n + r)
                assert c.put(keys, data) == 3
                with c.get(keys) as views:
                    assert [bytes(v) for v in views] == data
            if own:
                c.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n, n < 3)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shared.close()
    assert not errors, errors
    with daemon.client(namespace="probe", use_arena=False) as probe:
        assert probe.stats()["chunks"] == 6 * 15 * 3


def test_puts_go_on_after_a_daemon_restart(daemon):
    with daemon.client(namespace="t") as c:
        c.put(c.chunk_keys([1] * 256), _chunks(1, 5000, 1))
        assert c.held_credit is not None
        daemon.restart()
        keys = c.chunk_keys([2] * 512)
        data = _chunks(2, 6000, 2)
        assert c.put(keys, data) == 2
        with c.get(keys) as views:
            assert [bytes(v) for v in views] == data
        assert c.put(c.chunk_keys([3] * 256), _chunks(1, 6000, 3)) == 1
        assert c.stats()["credits"]["puts"] >= 1   # back on credits with the new daemon


def test_eviction_never_hands_out_lent_space(start_daemon):
    d = start_daemon("--host-mem", "16MiB", "--disk-size", "0")   # credits of up to 512 KiB
    with d.client(namespace="idle") as idle, d.client(namespace="busy") as busy:
        idle.put(idle.chunk_keys([0] * 256), [b"\x01" * (256 << 10)])
        held = idle.held_credit
        assert held is not None and held.size >= 256 << 10
        chains = []
        for r in range(80):   # 80 × 512 KiB through a 16 MiB arena: eviction all the way
            keys = busy.chunk_keys([r + 1] * 512)
            data = _chunks(2, 200 << 10, r)
            assert busy.put(keys, data) == 2
            chains.append((keys, data))
        idle.arena_view[held.offset:held.offset + held.size] = b"\xee" * held.size   # scribble on the credit
        stats = busy.stats()
        assert stats["counters"]["evictions"] > 0 and stats["credits"]["active"] == 2
        found = 0
        for keys, data in chains:
            with busy.get(keys) as views:
                assert [bytes(v) for v in views] == data[:len(views)]
                found += len(views)
        assert found > 0


def test_credit_puts_are_checksummed_and_written_back(start_daemon):
    d = start_daemon()
    with d.client(namespace="t") as c:
        keys = c.chunk_keys(list(range(256 * 3)))
        data = _chunks(3, 20000, 5)
        c.put(keys, data)
        assert wait_for(lambda: c.stats()["counters"]["disk_writes"] == 3, 10)
        with c.get(keys, verify=True) as views:
            assert [bytes(v) for v in views] == data
    d.restart()
    with d.client(namespace="t") as c:
        with c.get(keys, verify=True) as views:
            assert [bytes(v) for v in views] == data


def test_a_writer_holds_one_credit_and_a_forgotten_one_is_freed(daemon):
    """A writer that lost a reply (a timeout) asks again naming no credit: the one it forgot is freed, never
    left lent, and never written into by it."""
    raw, first = _raw_with_credit(daemon.address, 8 * PAGE)
    try:
        again = raw.request({"op": Op.CREDIT_PUT, "id": 5, "credit": 0, "keys": b"", "want": 8 * PAGE})
        assert again["ok"] and again["credit"]
        with daemon.client(namespace="t", use_arena=False) as probe:   # the raw clients' namespace (keys bound to it)
            credits = probe.stats()["credits"]
            assert credits["active"] == 1 and credits["lent_bytes"] == again["size"]
        stale = raw.request({"op": Op.CREDIT_PUT, "id": 6, "credit": first["credit"], "keys": os.urandom(16),
                             "offsets": [first["offset"]], "sizes": [10], "want": 0})
        assert first["credit"] == again["credit"] or stale["code"] == kvstore.ReservationError.code
    finally:
        raw.close()


def test_a_reserve_that_needs_the_writers_own_credit_takes_it_in_the_same_request(start_daemon):
    """The room a reserve needs is held by its writer's own credit: the daemon frees the credit the reserve names
    and succeeds, with no error reply the writer never sees (a client that retried after giving the credit back
    left the daemon counting one more error than its clients saw; issue 24, item 13)."""
    d = start_daemon("--host-mem", "4MiB", "--disk-size", "0")   # credits of up to 128 KiB
    with d.client(namespace="own") as c, d.client(namespace="fill") as fill:
        c.put([os.urandom(16)], [b"c" * (64 << 10)])   # leaves c a 128 KiB credit
        assert c.held_credit is not None and c.held_credit.size == 128 << 10
        s = c.stats()
        rest = s["tiers"]["host"]["capacity_bytes"] - s["tiers"]["host"]["used_bytes"] - s["credits"]["lent_bytes"]
        key = os.urandom(16)
        fill.put([key], [b"f" * rest])
        with fill.get([key]):   # the tier is full: only c's own chunk can go, and it is too small
            errors = c.stats()["errors"]
            reservation = c.reserve([os.urandom(16)], [128 << 10])
            reservation.abort()
            after = c.stats()
        assert c.held_credit is None            # the daemon freed it: the client forgot it
        assert after["errors"] == errors, after   # no error reply on the way
        assert after["credits"]["active"] == 0    # c's credit went back to the free space
