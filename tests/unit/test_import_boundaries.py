"""The layers stay separate: the Kafka clients (aiokafka, confluent_kafka) only in the Kafka layer
(and the tools and benches that drive a broker directly), torch only in the model layer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

KAFKA_CLIENTS = ("aiokafka", "confluent_kafka")

# (package directory, modules it must never import)
RULES: list[tuple[str, set[str]]] = [
    ("schemas", {*KAFKA_CLIENTS, "torch", "transformers", "consumer", "producer_tools"}),
    ("consumer/batching", {*KAFKA_CLIENTS, "torch", "transformers"}),
    ("consumer/model", set(KAFKA_CLIENTS)),
    ("consumer/kafka", {"torch", "transformers"}),
    ("consumer/cpu", {*KAFKA_CLIENTS, "torch", "transformers", "tokenizers", "onnxruntime"}),
    ("producer_tools", {"torch", "transformers"}),
    ("consumer/tracing", {*KAFKA_CLIENTS, "torch", "transformers"}),
]
# A Kafka client may appear only under these (the adapters, the client tools, the benches'
# hand-written baselines); torch/transformers only under these.
ONLY_UNDER = {
    "aiokafka": ("consumer/kafka", "producer_tools", "consumer/bench"),
    "confluent_kafka": ("consumer/kafka", "producer_tools", "consumer/bench"),
    "torch": ("consumer/model",),
    "transformers": ("consumer/model",),
    "onnxruntime": ("consumer/model",),
    "sentence_transformers": ("consumer/model",),
    # the optional kbatch[otel] extra (docs/TRACING.md), imported only where tracing lives
    "opentelemetry": ("consumer/tracing", "producer_tools/tracing.py"),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _python_files(rel: str) -> list[Path]:
    return sorted((ROOT / rel).rglob("*.py"))


@pytest.mark.parametrize(("package", "forbidden"), RULES, ids=[r[0] for r in RULES])
def test_package_does_not_import(package: str, forbidden: set[str]) -> None:
    files = _python_files(package)
    assert files, f"{package} has no Python files"
    offenders = {
        str(f.relative_to(ROOT)): sorted(_imports(f) & forbidden)
        for f in files
        if _imports(f) & forbidden
    }
    assert offenders == {}


@pytest.mark.parametrize("module", sorted(ONLY_UNDER))
def test_heavy_imports_stay_in_their_layer(module: str) -> None:
    allowed = ONLY_UNDER[module]
    offenders = [
        str(f.relative_to(ROOT))
        for pkg in ("consumer", "schemas", "producer_tools")
        for f in _python_files(pkg)
        if module in _imports(f) and not str(f.relative_to(ROOT)).startswith(allowed)
    ]
    assert offenders == []


# ---- the transport seam: which Kafka client each module of consumer/ loads ----------------------


def _is_type_checking(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_imports(path: Path, module: str, *, module_level: bool) -> set[str]:
    """The dotted names ``module`` imports when it runs (``from a.b import c`` gives ``a.b``
    and ``a.b.c``): not under ``if TYPE_CHECKING:``; with ``module_level``, not inside a
    function or class either (a lazy import runs only when called)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.orelse)
            elif module_level and isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
            ):
                continue
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit([n for n in getattr(node, field, []) if isinstance(n, ast.stmt)])
                if isinstance(node, ast.Try):
                    for handler in node.handlers:
                        visit(handler.body)

    visit(ast.parse(path.read_text(), filename=str(path)).body)
    return found


CHOOSES_THE_CLIENT = frozenset({"consumer.kafka.transport"})
"""Modules whose functions import an adapter: the one ``--kafka-client`` names, when called
(their lazy imports are not followed; their module-level ones are)."""


def _consumer_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in _python_files("consumer"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _loaded(start: str, *, module_level: bool) -> dict[str, list[str]]:
    """Every top-level package and consumer module that importing ``start`` (and, without
    ``module_level``, running its functions) loads, each with one chain of imports to it."""
    modules = _consumer_modules()

    def own(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    chains: dict[str, list[str]] = {start: [start]}
    todo = [start]
    while todo:
        module = todo.pop()
        lazy_too = not module_level and module not in CHOOSES_THE_CLIENT
        targets = _run_time_imports(modules[module], module, module_level=not lazy_too)
        parents = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        for target in targets | parents:
            found = own(target) if target.startswith("consumer") else target.split(".")[0]
            if found and found not in chains:
                chains[found] = [*chains[module], found]
                if found in modules:
                    todo.append(found)
    return chains


CONFLUENT_ADAPTER = sorted(m for m in _consumer_modules() if ".confluent_adapter" in m)


@pytest.mark.parametrize("module", CONFLUENT_ADAPTER)
def test_the_confluent_adapter_loads_no_aiokafka(module: str) -> None:
    """``--kafka-client confluent`` runs without aiokafka: no confluent module imports it,
    directly or through a module of consumer.kafka, at module level or in a function."""
    assert _loaded(module, module_level=False).get("aiokafka") is None


SEAM_AND_PURE = (
    "consumer.kafka.transport",
    "consumer.kafka.errors",
    "consumer.kafka.records",
    "consumer.kafka.config",
    "consumer.kafka.offsets",
    "consumer.kafka.offset_metadata",
    "consumer.kafka.flow",
    "consumer.kafka.ranges",
    "consumer.kafka.transactional_ids",
)
"""The seam (its Protocols and factories; the factories import an adapter when called) and
the modules both adapters share."""


@pytest.mark.parametrize("module", SEAM_AND_PURE)
def test_the_seam_and_the_pure_modules_load_no_kafka_client(module: str) -> None:
    loaded = _loaded(module, module_level=True)
    assert {c: loaded[c] for c in KAFKA_CLIENTS if c in loaded} == {}


ADAPTER_MODULES = (
    "consumer.kafka.source",
    "consumer.kafka.sink",
    "consumer.kafka.transactions",
    "consumer.kafka.range_source",
    "consumer.kafka.group_range",
    "consumer.kafka.confluent_adapter",
)
"""The data-plane adapters: what ``--kafka-client`` chooses, reached through the seam only."""

CONTROL_PLANE_ON_AIOKAFKA = {
    # These run on aiokafka whatever --kafka-client says: topic creation and checks, the
    # replicas' group admin, the jobs topic, and aiokafka's client start and error mapping
    # around them. Modules above the seam import them directly.
    "consumer.kafka.admin",
    "consumer.kafka.aiokafka_errors",
    "consumer.kafka.client_config",
    "consumer.kafka.jobs_topic",
}

ABOVE_THE_SEAM = ("consumer/serve", "consumer/finish", "consumer/backfill", "consumer/jobs")


def test_modules_above_the_seam_import_no_adapter() -> None:
    """serve, finish, backfill and jobs reach the data-plane clients through
    consumer.kafka.transport only; of the rest of consumer.kafka they import the seam, the pure
    modules and the control-plane modules of :data:`CONTROL_PLANE_ON_AIOKAFKA`."""
    modules = _consumer_modules()
    allowed = {*SEAM_AND_PURE, *CONTROL_PLANE_ON_AIOKAFKA, "consumer.kafka"}
    offenders: dict[str, list[str]] = {}
    for module, path in modules.items():
        if not str(path.relative_to(ROOT)).startswith(ABOVE_THE_SEAM):
            continue
        imported = {i for i in _imports_dotted(path, module) if i.startswith("consumer.kafka")}
        owned = {_owner(i, modules) for i in imported}
        bad = sorted(
            o
            for o in owned
            if o is not None and (o not in allowed or any(o.startswith(a) for a in ADAPTER_MODULES))
        )
        if bad:
            offenders[module] = bad
    assert offenders == {}


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports_dotted(path: Path, module: str) -> set[str]:
    """Every consumer module ``module`` imports, TYPE_CHECKING and lazy imports included."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_the_walk_follows_imports_through_other_modules(tmp_path: Path) -> None:
    """The checks above would miss nothing: a lazy import in a function and an import through
    a second module are both found; a TYPE_CHECKING import is not a run-time one."""
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "import consumer.kafka.records\n"
        "if TYPE_CHECKING:\n    import aiokafka\n"
        "def f():\n    from consumer.kafka import admin\n"
    )
    assert _run_time_imports(module, "consumer.x", module_level=True) == {
        "typing",
        "typing.TYPE_CHECKING",
        "consumer.kafka.records",
    }
    lazy = _run_time_imports(module, "consumer.x", module_level=False)
    assert {"consumer.kafka", "consumer.kafka.admin"} <= lazy and "aiokafka" not in lazy
    chain = _loaded("consumer.kafka.admin", module_level=False)["aiokafka"]
    assert chain[0] == "consumer.kafka.admin" and chain[-1] == "aiokafka"


def test_the_confluent_adapter_imports_with_aiokafka_missing() -> None:
    """The run-time check of the walk above: with aiokafka made unimportable, every confluent
    module and the seam still import."""
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'aiokafka':\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import importlib\n"
        f"for m in {[*CONFLUENT_ADAPTER, *SEAM_AND_PURE]!r}:\n"
        "    importlib.import_module(m)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocker], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
