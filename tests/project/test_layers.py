"""The layers, read from every import in kvstore/ and connectors/ (module level, ``TYPE_CHECKING`` blocks and
inside functions; relative imports resolved; ``support/imports.py``).

- ``tiers/`` is media and I/O: it imports neither the bookkeeping (``store/``) nor the daemon (``server/``).
- What an engine's process loads (the client, the connectors, ``config.py`` and its ``config_readers.py``) and the
  leaf package both sides map (``mapped/``) import no daemon room: ``store/``, ``tiers/``, ``server/``.
- ``store/`` never imports ``server/``; ``protocol/`` imports only leaves.
- No two rooms import each other, directly or around a longer loop.
- Inside the daemon (``server/``): ``transport/`` and ``events/`` import no other room of it, ``requests/``
  never imports ``lifecycle/``.
- No source file under kvstore/ or connectors/ is longer than ``MAX_LINES`` (450): a module is split by idea
  before then.
- At the top level, bench/ and harness/ import nothing of tests/: neither ``tests.*`` nor a name that the tests'
  folder puts on ``sys.path`` under pytest (``support``, ``conftest``, ...). What both share is in harness/, which
  imports no benchmark either (``test_import_cycles.py``).

What still breaks a rule is listed in ``OWED``, import by import: the list may only shrink. A new import that
breaks a rule fails here, and so does a listed one that is gone (strike it from the list).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.imports import import_graph, imported_packages, room_edges, room_of
from support.paths import ROOT, TESTS

from project.test_import_cycles import cycles

DAEMON = ("kvstore.store", "kvstore.tiers", "kvstore.server")
ENGINE_SIDE = ("kvstore.client", "kvstore.config", "kvstore.config_readers", "kvstore.mapped",
               "kvstore.connectors.common", "kvstore.connectors.vllm", "kvstore.connectors.sglang",
               "kvstore.connectors.hf")
LEAVES = ("kvstore.errors", "kvstore.units", "kvstore.logs", "kvstore.keys", "kvstore.defaults",
          "kvstore.native", "kvstore.ops", "kvstore.protocol")
RULES: dict[str, tuple[str, ...]] = {
    "kvstore.tiers": ("kvstore.store", "kvstore.server"),
    "kvstore.store": ("kvstore.server",),
    **{side: DAEMON for side in ENGINE_SIDE},
}
SERVER_ROOMS = ("lifecycle", "requests", "transport", "events")
SERVER_RULES: dict[str, tuple[str, ...]] = {
    "transport": ("lifecycle", "requests", "events"),
    "events": ("lifecycle", "requests", "transport"),
    "requests": ("lifecycle",),
}

# Nothing is owed between the layer rules' rooms (the movers see their ledgers through ``tiers/ledger_api.py``).
OWED: set[tuple[str, str]] = set()
# Rooms that still import each other: the native copy kernels, which take the paged layout of ops/ while ops/
# finds them through native/.
OWED_ROOMS = {("kvstore.native", "kvstore.ops")}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    found = import_graph()
    assert "kvstore.store.store" in found and "kvstore.connectors.vllm.worker" in found   # the walk found both trees
    return found


def breaking(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every (module, imported module) pair that breaks a rule."""
    return {(module, dep) for module, deps in graph.items() for dep in deps
            if room_of(dep) in RULES.get(room_of(module), ())}


def test_no_import_breaks_a_layer_rule_beyond_those_owed(graph):
    assert breaking(graph) - OWED == set()


def test_every_import_owed_is_still_there(graph):
    assert OWED - breaking(graph) == set(), "paid: strike these from OWED"


def server_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["kvstore", "server"] and len(parts) > 3 else None


def test_the_daemon_is_four_rooms_that_import_down_only(graph):
    packages = {f"kvstore.server.{room}" for room in SERVER_ROOMS}
    server = [m for m in graph if m.startswith("kvstore.server.") and m not in packages]
    assert {server_room(m) for m in server} == set(SERVER_ROOMS), "every daemon module lives in a room"
    for module in server:
        for dep in graph[module]:
            assert server_room(dep) not in SERVER_RULES.get(server_room(module) or "", ()), (module, dep)


def test_protocol_and_the_leaves_import_only_leaves(graph):
    for module, deps in graph.items():
        if room_of(module) in LEAVES:
            assert {room_of(d) for d in deps} <= set(LEAVES) | {room_of(module)}, module


def test_no_two_rooms_import_each_other_beyond_what_is_owed(graph):
    rooms: dict[str, set[str]] = {}
    for (importer, imported), _ in room_edges(graph).items():
        if (importer, imported) not in OWED_ROOMS:
            rooms.setdefault(importer, set()).add(imported)
            rooms.setdefault(imported, set())
    assert cycles(rooms) == []


def test_every_room_loop_owed_is_still_there(graph):
    assert set(room_edges(graph)) >= OWED_ROOMS, "paid: strike these from OWED_ROOMS"


def test_the_rules_catch_what_they_are_for():
    made_up = {"kvstore.tiers.disk.tier": {"kvstore.store.store"}, "kvstore.client.client": {"kvstore.tiers.gpu.pool"},
               "kvstore.mapped.arena": {"kvstore.errors"}, "kvstore.store.store": {"kvstore.server.lifecycle.daemon"}}
    assert breaking(made_up) == {("kvstore.tiers.disk.tier", "kvstore.store.store"),
                                 ("kvstore.client.client", "kvstore.tiers.gpu.pool"),
                                 ("kvstore.store.store", "kvstore.server.lifecycle.daemon")}


# Files in the hundreds of lines (STYLE.md, 10): no source file under kvstore/ or connectors/ longer than this.
MAX_LINES = 450


def long_files() -> set[str]:
    root = Path(__file__).resolve().parents[2]
    return {str(path.relative_to(root)) for top in ("kvstore", "connectors") for path in (root / top).rglob("*.py")
            if len(path.read_text().splitlines()) > MAX_LINES}


def test_no_source_file_is_longer_than_the_bound():
    assert long_files() == set(), f"split these by idea (at most {MAX_LINES} lines)"


def names_of_the_tests() -> set[str]:
    """The top-level names an import of the tests goes by: ``tests``, and every folder and module directly under
    tests/ (on ``sys.path`` under pytest) but those the repository's root has too (``bench``, ``connectors``: the
    real packages)."""
    beside = {name.removesuffix(".py") for name in os.listdir(TESTS) if name != "__pycache__"}
    return {"tests"} | beside - {name.removesuffix(".py") for name in os.listdir(ROOT)}


def importing_the_tests(imports: dict[str, set[str]], names: set[str]) -> set[tuple[str, str]]:
    """Every (module, imported package) pair where the package is the tests'."""
    return {(module, dep) for module, deps in imports.items() for dep in deps if dep.split(".")[0] in names}


def test_bench_and_the_harness_import_nothing_of_the_tests():
    imports = imported_packages(("bench", "harness"))
    assert "bench.ttft_hybrid" in imports and "harness.engines.vllm_real" in imports   # the walk found both trees
    assert importing_the_tests(imports, names_of_the_tests()) == set()


def test_the_tree_rule_catches_what_it_is_for():
    names = names_of_the_tests()
    assert {"tests", "support", "conftest"} <= names and not {"bench", "connectors", "harness", "kvstore"} & names
    made_up = {"bench.a": {"tests.support.engines", "harness.engines.vllm_real", "bench._common"},
               "harness.b": {"support.paths", "os"}, "bench.c": {"conftest", "kvstore.client"}}
    assert importing_the_tests(made_up, names) == {("bench.a", "tests.support.engines"), ("harness.b", "support.paths"),
                                                   ("bench.c", "conftest")}
