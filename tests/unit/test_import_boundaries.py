"""The layers stay separate: the Kafka clients (aiokafka, confluent_kafka) only in the Kafka layer
(and the tools and benches that drive a broker directly), torch only in the model layer."""

from __future__ import annotations

import ast
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
