"""Lookups answered from the shared index, told to the daemon in batched notes (``SeenNotes``): lookups that asked
and found the same are told once with their count, and the daemon's eviction queues and counters end exactly as
if each had been told in turn, under every policy; a real daemon counts every lookup of a coalesced note."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings, strategies as st

from kvstore.keys import KEY_BYTES
from kvstore.mapped.index_reader import SeenNotes
from kvstore.protocol.messages import LookupSeen
from kvstore.store.policies import POLICIES
from kvstore.store.store import Store
from kvstore.tiers.host.tier import HostTier
from kvstore.store.ledgers.builder import tier_ledgers
from kvstore.tiers.virtual import VirtualArena

PAGE = 4096
KEYS = [os.urandom(KEY_BYTES) for _ in range(12)]
# overlapping chains: prefixes of one another and chains that share keys
CHAINS = [KEYS[:2], KEYS[:5], KEYS[:8], KEYS[3:6], KEYS[8:12], KEYS[9:10], []]


def _store(policy: str) -> Store:
    store = Store(HostTier(VirtualArena(64 * PAGE)), 30.0, 30.0, tier_ledgers(policy), clock=lambda: 0.0)
    handle, _ = store.reserve(b"w", "ns", KEYS, [PAGE] * len(KEYS), None)
    store.commit(b"w", handle.id)
    return store


def _queue_state(store: Store) -> dict:
    """Everything an eviction queue holds, order included (each policy keeps ordered dicts of entries or counts);
    entries by key, since each store has its own."""
    def plain(value):
        if isinstance(value, dict):
            return [(k, v.key if hasattr(v, "key") else v) for k, v in value.items()]
        return value
    return {name: plain(value) for name, value in vars(store.lru).items()}


@settings(max_examples=80, deadline=None, database=None)
@given(policy=st.sampled_from(sorted(POLICIES)),
       lookups=st.lists(st.tuples(st.integers(0, len(CHAINS) - 1), st.integers(0, 3)), min_size=1, max_size=40))
def test_a_coalesced_note_leaves_the_queues_and_counters_as_one_note_per_lookup(policy, lookups):
    one_by_one, coalesced = _store(policy), _store(policy)
    notes = SeenNotes(interval=1e9, max_keys=1 << 30)
    for chain_id, extra in lookups:
        found = CHAINS[chain_id]
        asked = len(found) + extra
        one_by_one.note_lookup(asked, found)
        notes.add(asked, found)
    note = LookupSeen.parse({"id": 1, **notes.take()})
    assert len(note.asked) == len({(len(CHAINS[c]) + e, c) for c, e in lookups})
    for asked, found, repeat in zip(note.asked, note.found, note.repeat):
        coalesced.note_lookup(asked, found, repeat)
    assert _queue_state(coalesced) == _queue_state(one_by_one)
    assert vars(coalesced.counters) == vars(one_by_one.counters)


def test_repeated_lookups_are_one_entry_at_the_place_of_the_last():
    notes = SeenNotes(interval=1e9)
    a, b = KEYS[:3], KEYS[3:5]
    for found in (a, b, a, a):
        notes.add(len(found), found)
    note = notes.take()
    assert note["found"] == [b"".join(b), b"".join(a)] and note["repeat"] == [1, 3]
    notes.add(2, b)
    assert "repeat" not in notes.take()   # a note of single lookups is what it always was


@pytest.mark.parametrize("repeat", [[0], [1, 1], ["2"], [True], [1 << 21]])
def test_a_bad_repeat_field_is_refused_with_one_line(repeat):
    from kvstore.errors import BadRequestError

    with pytest.raises(BadRequestError, match="field 'repeat'"):
        LookupSeen.parse({"asked": [2], "found": [b"".join(KEYS[:2])], "repeat": repeat})


def test_the_daemon_counts_every_lookup_of_a_coalesced_note(daemon):
    with daemon.client(namespace="seen", chunk_tokens=4) as c:
        if c.shared_index is None:
            pytest.skip("no shared index on this machine")
        keys = c.chunk_keys(list(range(4 * 3)))
        c.put(keys, [b"x" * 100] * 3)
        before = c.stats()["counters"]
        for _ in range(25):
            assert c.lookup(keys) == 3
        after = c.stats()["counters"]   # a request: the pending note goes first
        assert after["lookups"] - before["lookups"] == 25
        assert after["hit_keys"] - before["hit_keys"] == 75
        assert c.stats()["errors"] == 0
