"""The import graph of consumer/, schemas/ and producer_tools/: no circle, and who may import
whom among kbatch's own modules (test_import_boundaries.py holds the third-party rules).

Every import counts, at module level, inside a function or under ``if TYPE_CHECKING:``
(a circle of type-only imports still tangles the modules for a reader).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("consumer", "schemas", "producer_tools")


def _modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module → the modules of ``packages`` it imports (a package's ``__init__`` counts as
    the package; importing ``a.b.c`` where ``c`` is a name counts as importing ``a.b``)."""
    modules = _modules(root, packages)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                found = resolve(target)
                if found and found != module and found != package:
                    graph[module].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circle_anywhere() -> None:
    assert cycles(import_graph(ROOT, PACKAGES)) == []


def test_the_detector_finds_a_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import x\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.c\n"
    )
    (pkg / "c.py").write_text("def f():\n    from . import a\n")
    (pkg / "d.py").write_text("from pkg import a\n")
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.c"]]


def _importers_of(target: str) -> list[str]:
    graph = import_graph(ROOT, PACKAGES)
    return sorted(m for m, deps in graph.items() if target in deps)


def test_only_the_cli_imports_the_serve_wiring() -> None:
    assert [
        m for m in _importers_of("consumer.serve.app") if not m.startswith("consumer.cli")
    ] == []


def _imports_of_consumer_outside(package: str) -> dict[str, list[str]]:
    """Module of ``package`` → the modules of ``consumer`` outside ``package`` it imports."""
    graph = import_graph(ROOT, PACKAGES)
    outside = {
        module: sorted(d for d in deps if d.startswith("consumer") and not d.startswith(package))
        for module, deps in graph.items()
        if module.startswith(package)
    }
    return {m: deps for m, deps in outside.items() if deps}


def test_the_kafka_layer_imports_nothing_of_consumer_outside_it() -> None:
    assert _imports_of_consumer_outside("consumer.kafka") == {}


def test_schemas_errors_is_a_leaf_of_schemas() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert {d for d in graph["schemas.errors"] if d.startswith("schemas")} == set()


COMMANDS = ("consumer.config", "consumer.cli", "consumer.serve.app", "consumer.backfill.config")
"""The command modules: settings of whole commands, the CLI, the serve wiring."""


def test_the_model_layer_imports_nothing_of_the_commands() -> None:
    graph = import_graph(ROOT, PACKAGES)
    leaks = {
        module: sorted(d for d in deps if d.startswith(COMMANDS))
        for module, deps in graph.items()
        if module == "consumer.model" or module.startswith("consumer.model.")
    }
    assert {m: deps for m, deps in leaks.items() if deps} == {}


def test_the_cpu_budget_imports_nothing_of_consumer_outside_it() -> None:
    """``consumer/cpu/`` sits below every layer: the model loader, the supervisor and the
    benches read it (docs/ARCHITECTURE.md §CPU budget)."""
    assert _imports_of_consumer_outside("consumer.cpu") == {}
