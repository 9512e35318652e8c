"""JSON Schema (draft 2020-12) files for the request and reply values, generated from the models.

The committed files ``schemas/request.schema.json`` and ``schemas/reply.schema.json`` are for
clients in other languages; a unit test fails when they drift from the models. Regenerate with::

    python -m schemas.jsonschema          # rewrite the files
    python -m schemas.jsonschema --check  # exit 1 when a file is stale

A schema describes the value's shape only. Rules the schema cannot state are in the field
descriptions and enforced by ``schemas.codec``: ``text`` at most ``max_text_bytes`` UTF-8 bytes,
``meta`` at most 4 KiB in the request's encoding, nesting at most 32 levels.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from schemas.models import Reply, Request

__all__ = ["SCHEMA_DIR", "main", "render", "reply_schema", "request_schema"]

SCHEMA_DIR: Final = Path(__file__).resolve().parent
"""Where the committed schema files live (the ``schemas`` package)."""

_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"


def _with_header(schema: dict[str, Any], title: str) -> dict[str, Any]:
    return {"$schema": _DIALECT, **schema, "title": title}


def request_schema() -> dict[str, Any]:
    """The request value's schema (what a client sends; ``Request`` in validation mode)."""
    return _with_header(Request.model_json_schema(mode="validation"), "kbatch request v1")


def reply_schema() -> dict[str, Any]:
    """The reply value's schema (what a client receives; ``Reply`` in validation mode)."""
    return _with_header(Reply.model_json_schema(mode="validation"), "kbatch reply v1")


def render() -> dict[str, str]:
    """File name → file text (2-space indented, non-ASCII kept, trailing newline)."""
    return {
        name: json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
        for name, schema in (
            ("request.schema.json", request_schema()),
            ("reply.schema.json", reply_schema()),
        )
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Write the schema files into ``--dir`` (default ``SCHEMA_DIR``); with ``--check`` only
    compare, print the stale files and return 1 when any is."""
    parser = argparse.ArgumentParser(prog="python -m schemas.jsonschema", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when a file is stale")
    parser.add_argument("--dir", type=Path, default=SCHEMA_DIR, help="output directory")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path: Path = args.dir / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run python -m schemas.jsonschema", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
