"""No import cycle inside kvstore/, nor inside bench/: walk every module's imports (module level,
``if TYPE_CHECKING`` blocks and imports inside functions alike) and look for a strongly connected component of
more than one module.

``from .pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``."""

from __future__ import annotations

import ast
import os
from support.paths import ROOT



def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    if rel.startswith("connectors."):   # the top-level connectors/ is imported as kvstore.connectors
        rel = "kvstore." + rel
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def import_graph(tops: tuple[str, ...] = ("kvstore", "connectors"), package: str = "kvstore") -> dict[str, set[str]]:
    """Each module under ``tops`` and the modules of ``package`` it imports."""
    raw: dict[str, set[tuple[str, str]]] = {}
    walks = [os.walk(os.path.join(ROOT, top)) for top in tops]
    for dirpath, dirnames, filenames in (entry for walk in walks for entry in walk):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for filename in filenames:
            if not filename.endswith(".py"):
                continue
            path = os.path.join(dirpath, filename)
            module = _module_name(path)
            package = module if filename == "__init__.py" else module.rsplit(".", 1)[0]
            deps: set[tuple[str, str]] = set()
            for node in ast.walk(ast.parse(open(path).read(), path)):
                if isinstance(node, ast.Import):
                    deps |= {(a.name, a.name) for a in node.names if a.name.startswith(package)}
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                        base = ".".join(parts + ([base] if base else []))
                    if base.startswith(package):
                        deps |= {(base + "." + a.name, base) for a in node.names}
            raw[module] = deps
    graph: dict[str, set[str]] = {}
    for module, deps in raw.items():
        resolved = {full if full in raw else base for full, base in deps}
        graph[module] = {d for d in resolved if d in raw and d != module}
    return graph


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
    assert "kvstore.server.handlers" in graph and "kvstore.store.store" in graph   # the walk found the tree
    assert cycles(graph) == []


def test_no_import_cycle_inside_bench():
    graph = import_graph(("bench",), "bench")
    assert "bench.peers" in graph and "bench.peers_lmcache" in graph   # the walk found the benchmarks
    assert cycles(graph) == []


def test_handlers_never_import_the_daemon():
    graph = import_graph()
    for name in ("handlers", "integrity_handlers", "service", "stats", "stream", "local_access"):
        assert "kvstore.server.daemon" not in graph[f"kvstore.server.{name}"], name


def test_the_walk_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
