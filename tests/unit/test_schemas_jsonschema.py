"""The committed JSON Schema files match the models, and describe what the codec writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from schemas import jsonschema as generator
from schemas.codec import Encoding, encode_reply, encode_request
from schemas.errors import ErrorCode
from schemas.models import (
    ClassifyResult,
    EmbedResult,
    ErrorInfo,
    ModelInfo,
    Reply,
    Request,
    Timing,
)

JSON = Encoding.JSON


def committed(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((generator.SCHEMA_DIR / name).read_text(encoding="utf-8"))
    return loaded


@pytest.mark.parametrize("name", ["request.schema.json", "reply.schema.json"])
def test_committed_schema_files_match_the_models(name: str) -> None:
    expected = generator.render()[name]
    actual = (generator.SCHEMA_DIR / name).read_text(encoding="utf-8")
    assert actual == expected, f"{name} is stale: run python -m schemas.jsonschema"


def test_generator_check_mode(tmp_path: Path) -> None:
    assert generator.main(["--check", "--dir", str(tmp_path)]) == 1  # nothing there yet
    assert generator.main(["--dir", str(tmp_path)]) == 0
    assert generator.main(["--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "reply.schema.json").write_text("{}\n", encoding="utf-8")
    assert generator.main(["--check", "--dir", str(tmp_path)]) == 1


@pytest.mark.parametrize("name", ["request.schema.json", "reply.schema.json"])
def test_schemas_are_valid_draft_2020_12(name: str) -> None:
    schema = committed(name)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize(
    "request_",
    [
        Request(text="x"),
        Request(text=" ", task="classify", deadline_ms=0, truncate=True, meta={"a": [1, None]}),
    ],
)
def test_encoded_requests_validate_against_the_request_schema(request_: Request) -> None:
    jsonschema.validate(
        json.loads(encode_request(request_, JSON)), committed("request.schema.json")
    )


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"text": ""},
        {"text": "x", "task": "other"},
        {"text": "x", "deadline_ms": True},
        {"text": "x", "deadline_ms": -1},
        {"text": "x", "v": 2},
        {"text": "x", "meta": []},
    ],
)
def test_request_schema_rejects_what_the_decoder_rejects(raw: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(raw, committed("request.schema.json"))


MODEL = ModelInfo(name="m", revision="r1")
TIMING = Timing(queue_ms=0.5, infer_ms=2.0, batch_size=4, padded_len=16)
REPLIES = [
    Reply(status="ok", result=EmbedResult(embedding=[0.6, 0.8], dim=2), model=MODEL, timing=TIMING),
    Reply(
        status="ok",
        result=ClassifyResult(label="a", score=0.7, scores={"a": 0.7, "b": 0.3}),
        model=MODEL,
        timing=TIMING,
        dedup=True,
        meta={"k": "v"},
    ),
    Reply(
        status="error", error=ErrorInfo(code=ErrorCode.INFERENCE_FAILED, message="x"), model=MODEL
    ),
    Reply(
        status="expired",
        error=ErrorInfo(code=ErrorCode.DEADLINE_EXCEEDED, message="x"),
        model=ModelInfo(name="m"),
    ),
]


@pytest.mark.parametrize("reply", REPLIES, ids=["embed", "classify", "error", "expired"])
def test_encoded_replies_validate_against_the_reply_schema(reply: Reply) -> None:
    jsonschema.validate(json.loads(encode_reply(reply, JSON)), committed("reply.schema.json"))


@pytest.mark.parametrize(
    "raw",
    [
        {"v": 1, "status": "ok", "model": {"name": "m", "revision": None}},  # no result/timing
        {"v": 1, "status": "error", "model": {"name": "m", "revision": None}},  # no error
        {"v": 1, "status": "done", "model": {"name": "m"}},
        {
            "v": 1,
            "status": "error",
            "error": {"code": "oops", "message": ""},
            "model": {"name": "m"},
        },
    ],
)
def test_reply_schema_rejects_replies_the_contract_forbids(raw: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(raw, committed("reply.schema.json"))
