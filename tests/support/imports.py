"""The import graph of a source tree, as the layering and cycle tests read it.

Every ``import`` and ``from ... import`` counts: at module level, under ``if TYPE_CHECKING`` and inside
functions alike. A relative import is resolved against the importing module's package. ``from pkg import
name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``. The top-level
``connectors/`` tree is read as ``kvstore.connectors``, the name it is installed under.
"""

from __future__ import annotations

import ast
import os
from collections import Counter

from support.paths import ROOT


def module_name(path: str) -> str:
    """The dotted name the file at ``path`` (under the repository root) is imported as."""
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    if rel.startswith("connectors."):   # the top-level connectors/ is imported as kvstore.connectors
        rel = "kvstore." + rel
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _modules(tops: tuple[str, ...]) -> dict[str, str]:
    found: dict[str, str] = {}
    for top in tops:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for filename in filenames:
                if filename.endswith(".py"):
                    path = os.path.join(dirpath, filename)
                    found[module_name(path)] = path
    return found


def _imported(module: str, path: str) -> set[tuple[str, str]]:
    """(the module or name imported, its package) for every import in the file."""
    own_package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    deps: set[tuple[str, str]] = set()
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            deps |= {(alias.name, alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = own_package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            deps |= {(f"{base}.{alias.name}", base) for alias in node.names}
    return deps


def import_graph(tops: tuple[str, ...] = ("kvstore", "connectors")) -> dict[str, set[str]]:
    """Each module under ``tops`` and the modules under ``tops`` it imports (itself left out)."""
    modules = _modules(tops)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        resolved = {full if full in modules else base for full, base in _imported(module, path)}
        graph[module] = {dep for dep in resolved if dep in modules and dep != module}
    return graph


def imported_packages(tops: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module under ``tops`` and every package or module it imports, in those trees or not (``from pkg
    import name`` counts as ``pkg``)."""
    return {module: {base for _, base in _imported(module, path)} for module, path in _modules(tops).items()}


def room_of(module: str) -> str:
    """The package a module belongs to for layering: ``kvstore.X`` for ``kvstore.X.*`` (an engine's connector
    package is its own room, ``kvstore.connectors.vllm``), the module itself for a top-level one."""
    parts = module.split(".")
    depth = 3 if parts[1:2] == ["connectors"] and len(parts) > 2 else 2
    return ".".join(parts[:depth])


def room_edges(graph: dict[str, set[str]]) -> Counter[tuple[str, str]]:
    """How many module imports cross from one room into another, per (importer, imported) pair."""
    edges: Counter[tuple[str, str]] = Counter()
    for module, deps in graph.items():
        for dep in deps:
            if room_of(module) != room_of(dep):
                edges[(room_of(module), room_of(dep))] += 1
    return edges
