"""The import graph of consumer/, schemas/ and producer_tools/: no circle, no upward import, and
who may import whom among kbatch's own modules (test_import_boundaries.py holds the third-party
rules).

Every import counts, at module level, inside a function or under ``if TYPE_CHECKING:``
(a circle of type-only imports still tangles the modules for a reader).

Rooms and layers (docs/ARCHITECTURE.md §Rooms): a *room* is a sub-package of ``consumer``
(``consumer.kafka``), a loose module of its root (``consumer.config``), or a top-level package
(``schemas``, ``producer_tools``). Each room sits in one layer of :data:`LAYERS`. A module may
import the modules of its own room and of the rooms of lower layers only: an import of a room
of its own layer (a peer) or of a higher one is *upward*. So the rooms form a layered order
without a cycle between them, and the root of ``consumer`` holds no module that its rooms'
layers would have to import upward (``consumer.config`` importing ``consumer.jobs`` was one).
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


LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "leaves",
        ("schemas", "consumer", "consumer.cpu", "consumer.deadline", "consumer.entities"),
    ),
    (
        "building blocks",
        (
            "consumer.kafka",
            "consumer.batching",
            "consumer.options",
            "consumer.lifecycle",
            "consumer.config_sources",
        ),
    ),
    (
        "model and replies",
        ("consumer.model", "consumer.replies", "consumer.broker", "consumer.tracing"),
    ),
    ("settings and finishing", ("consumer.config", "consumer.finish", "producer_tools")),
    ("backfill", ("consumer.backfill",)),
    ("jobs", ("consumer.jobs",)),
    ("serve and bench", ("consumer.serve", "consumer.bench")),
    ("command line", ("consumer.cli",)),
)
"""The layers, lowest first: (name, its rooms). A new room, or an import a layer does not
allow, is placed here (and in docs/ARCHITECTURE.md: ``python scripts/room_graph.py --write``)."""


def room_of(module: str, split: str = "consumer") -> str:
    """``consumer.kafka.source`` → ``consumer.kafka``; ``schemas.models`` → ``schemas`` (only the
    ``split`` package is cut into rooms)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == split else parts[0]


def room_graph(graph: dict[str, set[str]], split: str = "consumer") -> dict[str, set[str]]:
    """Room → the other rooms its modules import."""
    rooms: dict[str, set[str]] = {}
    for module, deps in graph.items():
        room = room_of(module, split)
        rooms.setdefault(room, set()).update(
            room_of(d, split) for d in deps if room_of(d, split) != room
        )
    return rooms


def upward_imports(
    graph: dict[str, set[str]],
    layers: tuple[tuple[str, tuple[str, ...]], ...],
    split: str = "consumer",
) -> list[str]:
    """``"importer -> imported"`` for each import of a module of another room of the importer's
    layer or above (a room missing from ``layers`` counts as above the top), sorted."""
    level = {room: i for i, (_, rooms) in enumerate(layers) for room in rooms}
    top = len(layers)
    return sorted(
        f"{module} -> {dep}"
        for module, deps in graph.items()
        for dep in deps
        if room_of(dep, split) != room_of(module, split)
        and level.get(room_of(dep, split), top) >= level.get(room_of(module, split), top)
    )


def _short(room: str) -> str:
    """How a room reads in the diagram: ``kafka/``, ``config.py``, ``schemas/``."""
    if room.startswith("consumer."):
        name = room.removeprefix("consumer.")
        return f"{name}/" if (ROOT / "consumer" / name).is_dir() else f"{name}.py"
    return f"{room}/" if room != "consumer" else "consumer/__init__.py"


def room_diagram(root: Path = ROOT) -> str:
    """The layers, top first, each room with the rooms it imports (text; docs/ARCHITECTURE.md
    §Rooms holds it, scripts/room_graph.py writes it there)."""
    rooms = room_graph(import_graph(root, PACKAGES))
    lines = []
    for i, (name, members) in reversed(list(enumerate(LAYERS))):
        lines.append(f"{i} {name}")
        for room in members:
            deps = " ".join(sorted(_short(d) for d in rooms.get(room, set())))
            lines.append(f"    {_short(room):<22}" + (f"-> {deps}" if deps else "").rstrip())
    return "\n".join(line.rstrip() for line in lines) + "\n"


def test_no_upward_import() -> None:
    assert upward_imports(import_graph(ROOT, PACKAGES), LAYERS) == []


def test_every_room_has_one_layer() -> None:
    placed = [room for _, rooms in LAYERS for room in rooms]
    assert len(placed) == len(set(placed))
    assert set(room_graph(import_graph(ROOT, PACKAGES))) == set(placed)


def test_the_layer_rule_finds_upward_and_peer_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    for room in ("low", "mid", "peer", "high"):
        (pkg / room).mkdir(parents=True)
        (pkg / room / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("def f():\n    from pkg.high.b import x\n")  # upward
    (pkg / "mid" / "a.py").write_text("from pkg.peer.c import y\nfrom pkg.low.a import f\n")
    (pkg / "peer" / "c.py").write_text("y = 1\n")
    (pkg / "high" / "b.py").write_text("from ..mid import a\nx = 1\n")  # downward: allowed
    layers = (("0", ("pkg.low",)), ("1", ("pkg.mid", "pkg.peer")), ("2", ("pkg.high",)))
    graph = import_graph(tmp_path, ("pkg",))
    assert upward_imports(graph, layers, split="pkg") == [
        "pkg.low.a -> pkg.high.b",
        "pkg.mid.a -> pkg.peer.c",
    ]
    assert upward_imports(graph, (("all", ("pkg.low", "pkg.mid", "pkg.peer")),), "pkg") == [
        "pkg.low.a -> pkg.high.b",  # a room missing from the layers sits above them all
        "pkg.mid.a -> pkg.low.a",  # peers now
        "pkg.mid.a -> pkg.peer.c",
    ]


def test_the_architecture_document_holds_the_current_room_diagram() -> None:
    """docs/ARCHITECTURE.md §Rooms shows :func:`room_diagram`; after a change of rooms or of
    their imports, ``python scripts/room_graph.py --write`` brings it up to date."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert room_diagram() in text


def test_the_module_index_names_every_module() -> None:
    """docs/reference/modules.md names every module (``python scripts/room_graph.py --write``)."""
    text = (ROOT / "docs" / "reference" / "modules.md").read_text()
    unnamed = [
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "__init__.py" and f"`{path.relative_to(ROOT)}`" not in text
    ]
    assert unnamed == []


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


def test_the_kafka_layer_imports_nothing_of_consumer_outside_it_but_the_cpu_leaf() -> None:
    """``consumer/kafka/`` is a building block: of the rest of ``consumer`` it may use only
    ``consumer.cpu.threads`` (a leaf below every layer: the consumer's owner thread names
    itself), never the batching, serving or model layers."""
    outside = _imports_of_consumer_outside("consumer.kafka")
    assert {m: [d for d in deps if d != "consumer.cpu.threads"] for m, deps in outside.items()} == {
        m: [] for m in outside
    }


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
    benches read it (docs/internals.md §CPU budget)."""
    assert _imports_of_consumer_outside("consumer.cpu") == {}
