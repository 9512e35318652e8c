"""The rooms of kbatch by layer, each with the rooms it imports, and every module with the first
sentence of its docstring: docs/ARCHITECTURE.md §Rooms and docs/reference/modules.md, drawn from
the code.

python scripts/room_graph.py            print both
python scripts/room_graph.py --write    put them into docs/ARCHITECTURE.md (between the
                                        ``room-graph`` markers) and docs/reference/modules.md
                                        (between the ``module-index`` markers)

The layers and the rule (no import of a peer or of a higher layer) are those of
tests/unit/test_import_graph.py, whose tests fail when the document's diagram is out of date
or a module is not named in it.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.unit.test_import_graph import LAYERS, room_diagram  # noqa: E402

DOC = ROOT / "docs" / "ARCHITECTURE.md"
MODULES_DOC = ROOT / "docs" / "reference" / "modules.md"

ROLES = {
    "consumer": "the root: what every command shares",
    "schemas": "the wire contract: records, codec, errors (no I/O)",
    "producer_tools": "the client side: request/load tools, reports",
    "consumer.cpu": "how many cores kbatch may use, and how its pools share them",
    "consumer.kafka": "the only aiokafka importer: sources, sinks, offsets, flow control",
    "consumer.batching": "pure batching policy and its asyncio engine",
    "consumer.model": "the only torch importer: backends, tokenizers, loader",
    "consumer.replies": "what a reply says: builder, task options, chunking, topic policy",
    "consumer.broker": "local Kafka brokers for development and tests",
    "consumer.tracing": "OpenTelemetry traces: trace headers, request, batch and job spans",
    "consumer.finish": "what finishes a record: delivery, checkpoint, exactly once",
    "consumer.backfill": "`kbatch backfill`",
    "consumer.jobs": "backfill jobs run by `kbatch serve`",
    "consumer.serve": "`kbatch serve` alone",
    "consumer.bench": "`kbatch bench …`",
    "consumer.cli": "the `kbatch` console script",
}
"""Room → what it holds, in a few words (the heading of its part of the module index)."""


def _first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    paragraph = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", paragraph).replace("``", "`")  # reST → md
    return re.split(r"(?<=[.!?])\s", paragraph, maxsplit=1)[0]


def _modules_of(room: str) -> list[Path]:
    if room == "consumer":  # the root's loose modules are rooms of their own
        return []
    base = ROOT / room.replace(".", "/")
    if base.is_dir():
        return sorted(p for p in base.rglob("*.py") if p.name != "__init__.py")
    return [base.with_suffix(".py")]


def module_index() -> str:
    """Markdown: per layer, top first, each room's modules, one line each."""
    lines: list[str] = []
    for i, (name, rooms) in reversed(list(enumerate(LAYERS))):
        lines.append(f"**{i} {name}**\n")
        for room in rooms:
            modules = _modules_of(room)
            if not modules:
                continue
            role = ROLES.get(room) or ROLES.get(room.rpartition(".")[0], "")
            if len(modules) > 1 or (ROOT / room.replace(".", "/")).is_dir():
                lines.append(f"- `{room.replace('.', '/')}/`: {role}")
                lines += [f"  - `{p.relative_to(ROOT)}`: {_first_sentence(p)}" for p in modules]
            else:
                lines.append(f"- `{modules[0].relative_to(ROOT)}`: {_first_sentence(modules[0])}")
        lines.append("")
    return "\n".join(lines)


def _replace(doc: Path, marker: str, body: str) -> None:
    """Put ``body`` between ``doc``'s ``marker`` markers.

    Raises:
        ValueError: ``doc`` lacks the pair of markers.
    """
    start, end = f"<!-- {marker}:start -->\n", f"<!-- {marker}:end -->\n"
    head, found_start, rest = doc.read_text().partition(start)
    _, found_end, tail = rest.partition(end)
    if not found_start or not found_end:
        raise ValueError(f"{doc} lacks the markers {start.strip()} … {end.strip()}")
    doc.write_text(f"{head}{start}{body}{end}{tail}")


def write(doc: Path = DOC, modules_doc: Path = MODULES_DOC) -> None:
    """Replace the diagram in ``doc`` and the module index in ``modules_doc`` with the current
    ones.

    Raises:
        ValueError: a document lacks its pair of markers.
    """
    _replace(doc, "room-graph", f"```text\n{room_diagram()}```\n")
    _replace(modules_doc, "module-index", module_index())


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.stdout.write(room_diagram() + "\n" + module_index())
