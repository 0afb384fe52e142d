"""The remote book (``tiers/remote/book.py``): a tenant's remote ceiling held on the values this daemon wrote.
Its booked bytes never pass the ceiling whatever the sequence of puts, landings, deletes (succeeding or failing)
and values seen missing; victims are the tenant's oldest landed values; a put the ceiling cannot make room for
is refused."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.tiers.remote.book import Plan, RemoteBook

CEILING = 10


def book() -> RemoteBook:
    return RemoteBook(lambda tenant: CEILING if tenant == "a" else None)


def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def test_a_put_past_the_ceiling_deletes_the_tenants_oldest_landed_values_first():
    b = book()
    for i in range(5):   # 5 values of 2: at the ceiling
        plan = b.plan("a", [key(i)], [2])
        assert plan is not None and not plan.victims
        b.landed(plan)
    plan = b.plan("a", [key(5), key(6)], [2, 2])
    assert plan is not None and plan.victim_keys == [key(0), key(1)]
    assert b.tenants["a"].bytes == 14   # counted until the delete succeeded: the put waits for it
    b.deleted(plan)
    assert b.stats("a") == {"bytes": 10, "deleted_for_ceiling": 2, "ceiling_refusals": 0, "seen_missing": 0}


def test_values_still_in_flight_are_never_victims_and_a_put_without_room_is_refused():
    b = book()
    first = b.plan("a", [key(0), key(1)], [4, 4])
    assert first is not None
    assert b.plan("a", [key(2)], [4]) is None   # the others are still being written: deleting them could race
    assert b.plan("a", [key(3)], [11]) is None   # larger than the ceiling
    assert b.stats("a")["ceiling_refusals"] == 2
    b.landed(first)
    plan = b.plan("a", [key(2)], [4])
    assert plan is not None and plan.victim_keys == [key(0)]


def test_a_failed_delete_books_the_victims_again_and_not_the_put():
    b = book()
    for i in range(5):
        b.landed(b.plan("a", [key(i)], [2]))
    plan = b.plan("a", [key(9)], [2])
    assert plan is not None and plan.victim_keys == [key(0)]
    b.restore(plan)
    values = b.tenants["a"].values
    assert b.tenants["a"].bytes == 10 and next(iter(values)) == key(0) and key(9) not in values
    again = b.plan("a", [key(9)], [2])
    assert again is not None and again.victim_keys == [key(0)]


def test_a_put_never_sent_unbooks_only_what_no_later_put_wrote():
    b = book()
    first = b.plan("a", [key(0)], [3])
    second = b.plan("a", [key(0), key(1)], [3, 3])   # key 0 again, while the first put is in flight
    assert first is not None and second is not None
    b.landed(second)
    b.unsent(first)   # the backend never took the first: key 0 stays booked, the second wrote it
    assert b.tenants["a"].bytes == 6 and key(0) in b.tenants["a"].values
    b.unsent(b.plan("a", [key(2)], [3]))
    assert b.tenants["a"].bytes == 6 and key(2) not in b.tenants["a"].values


def test_a_value_seen_missing_leaves_the_book_and_tenants_without_a_ceiling_are_not_booked():
    b = book()
    b.landed(b.plan("a", [key(0)], [6]))
    b.seen_missing(key(0))
    assert b.stats("a")["bytes"] == 0 and b.stats("a")["seen_missing"] == 1
    plan = b.plan("other", [key(1)], [100])
    assert plan is not None and not plan.victims and not plan.fresh and "other" not in b.tenants


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "land", "delete", "fail", "unsent", "missing"]),
                          st.integers(0, 11), st.integers(1, 6)), max_size=60))
def test_the_booked_bytes_never_pass_the_ceiling_once_deletes_end(steps):
    b = book()
    pending: list[Plan] = []     # planned, victims not yet deleted (their put waits)
    in_flight: list[Plan] = []   # sent, not yet landed
    for op, k, size in steps:
        if op == "put":
            plan = b.plan("a", [key(k)], [size])
            if plan is not None:
                (pending if plan.victims else in_flight).append(plan)
        elif op in ("delete", "fail") and pending:
            plan = pending.pop(0)
            if op == "delete":
                b.deleted(plan)
                in_flight.append(plan)
            else:
                b.restore(plan)
        elif op == "land" and in_flight:
            b.landed(in_flight.pop(0))
        elif op == "unsent" and in_flight:   # the backend did not take the put (after any delete succeeded)
            b.unsent(in_flight.pop(0))
        elif op == "missing":
            b.seen_missing(key(k))
        t = b.tenants["a"]
        assert t.bytes - t.deleting <= CEILING   # what the store may hold once the deletes in flight end
        assert t.bytes == sum(v.nbytes for v in t.values.values()) + t.deleting and t.deleting >= 0
