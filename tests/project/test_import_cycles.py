"""No import cycle inside kvstore/, nor inside bench/ and harness/ (which imports no benchmark): every module's
imports (``support/imports.py``: module level, ``if TYPE_CHECKING`` blocks and imports inside functions alike,
relative ones resolved) and a strongly connected component of more than one module. The rooms' layering is
``test_layers.py``'s."""

from __future__ import annotations

from support.imports import import_graph



def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_inside_kvstore():
    graph = import_graph()
    assert "kvstore.server.requests.handlers" in graph and "kvstore.store.store" in graph   # the walk found the tree
    assert cycles(graph) == []


def test_no_import_cycle_inside_bench():
    graph = import_graph(("bench",))
    assert "bench.peers" in graph and "bench.peers_lmcache" in graph   # the walk found the benchmarks
    assert cycles(graph) == []


def test_the_harness_imports_no_benchmark_and_no_cycle():
    graph = import_graph(("harness", "bench"))
    assert "harness.daemons" in graph and "harness.engines.venv" in graph   # the walk found the harness
    assert {dep for module, deps in graph.items() if module.startswith("harness.") for dep in deps
            if not dep.startswith("harness")} == set()
    assert cycles(graph) == []


def test_the_walk_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
