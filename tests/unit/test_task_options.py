"""Contract 1.2's pure parts: the rerank fan-out (gathering, failures, cancellation), the task
options (admission and reply shaping), sparse formats, and the wire round trip of the three
results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from consumer.batching.fanout import FanOutEngine
from consumer.batching.types import InferenceItem, ItemOutcome, OutcomeStatus
from consumer.replies.task_options import (
    TASK_OPTIONS,
    TaskOptionError,
    TaskOptions,
    check_task_options,
    shape_task_result,
)
from schemas.codec import Encoding, decode_reply, decode_request, encode_reply, encode_request
from schemas.models import (
    MAX_DOCUMENTS,
    ModelInfo,
    Reply,
    Request,
    RerankResult,
    SparseResult,
    Timing,
    TokenClassifyResult,
)
from schemas.sparse import decode_sparse, sparse_result
from tests.fakes import FakeEngine


def outcome(
    item_id: int,
    status: OutcomeStatus = "ok",
    score: float = 0.5,
    *,
    n_tokens: int = 5,
    truncated: bool = False,
    code: str | None = None,
    queue_ms: float = 1.0,
) -> ItemOutcome:
    return ItemOutcome(
        item_id, status, {"score": score} if status == "ok" else None, code,
        None if code is None else f"{code} happened", truncated, n_tokens, queue_ms, 2.0, 4, 16,
    )  # fmt: skip


class Collect:
    def __init__(self) -> None:
        self.calls: list[list[ItemOutcome]] = []

    def __call__(self, outcomes: Sequence[ItemOutcome]) -> None:
        self.calls.append(list(outcomes))


async def fanned(items: list[InferenceItem]) -> tuple[FanOutEngine, FakeEngine, Collect]:
    collect = Collect()
    engine = FakeEngine()
    fanout = FanOutEngine(engine, collect)
    await fanout.submit(items)
    return fanout, engine, collect


async def test_a_request_becomes_one_pair_item_per_document_and_one_outcome() -> None:
    item = InferenceItem(7, "query", documents=("d one", "d two two", "d3"), group="tp")
    fanout, engine, collect = await fanned([item, InferenceItem(8, "plain text", group="tp")])
    pairs = engine.items
    assert [(p.text, p.text_pair, p.documents, p.group) for p in pairs[:3]] == [
        ("query", "d one", None, "tp"), ("query", "d two two", None, "tp"),
        ("query", "d3", None, "tp"),
    ]  # fmt: skip
    assert len({p.item_id for p in pairs}) == 4  # engine ids of the fan-out's own
    # Outcomes arrive out of order and in two calls; the item's comes with its last pair.
    fanout.on_outcomes([outcome(pairs[2].item_id, score=0.3, queue_ms=9.0)])
    assert collect.calls == []
    fanout.on_outcomes(
        [outcome(pairs[0].item_id, score=0.9, truncated=True), outcome(pairs[1].item_id, score=0.1),
         outcome(pairs[3].item_id, score=0.7)]
    )  # fmt: skip
    (done,) = collect.calls
    by_id = {o.item_id: o for o in done}
    rerank = by_id[7]
    assert rerank.result == {"scores": [0.9, 0.1, 0.3]}  # document order
    assert (rerank.n_tokens, rerank.truncated, rerank.queue_ms) == (15, True, 9.0)
    assert by_id[8].result == {"score": 0.7}  # an item without documents passes through


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [(["ok", "expired", "error"], "error"), (["expired", "ok", "ok"], "expired")],
)
async def test_a_failed_pair_fails_the_request(
    statuses: list[OutcomeStatus], expected: str
) -> None:
    fanout, engine, collect = await fanned([InferenceItem(1, "q", documents=("a", "b", "c"))])
    codes = {"ok": None, "error": "inference_failed", "expired": "deadline_exceeded"}
    fanout.on_outcomes(
        [outcome(p.item_id, s, code=codes[s]) for p, s in zip(engine.items, statuses, strict=True)]
    )
    ((done,),) = collect.calls
    assert (done.item_id, done.status, done.result) == (1, expected, None)
    assert done.error_code == codes[expected]


async def test_cancelling_a_group_forgets_its_requests_and_their_late_pairs() -> None:
    items = [InferenceItem(1, "q", documents=("a", "b"), group="gone"),
             InferenceItem(2, "q", documents=("a",), group="kept")]  # fmt: skip
    fanout, engine, collect = await fanned(items)
    assert fanout.cancel_group("gone") == [1]
    fanout.on_outcomes([outcome(p.item_id) for p in engine.items])  # late pairs of item 1 too
    assert [[o.item_id for o in call] for call in collect.calls] == [[2]]


def test_each_option_belongs_to_one_task_and_is_refused_elsewhere() -> None:
    assert TASK_OPTIONS == {
        "documents": "rerank",
        "top_n": "rerank",
        "top_k": "sparse",
        "aggregation": "token-classify",
        "redact": "token-classify",
        "chunking": "embed",
    }
    check_task_options(Request(text="q", documents=["d"], top_n=1), "rerank")
    check_task_options(Request.model_validate({"query": "q", "documents": ["d"]}), "rerank")
    check_task_options(Request(text="t", top_k=3, encoding_format="f16le"), "sparse")
    check_task_options(Request(text="t", aggregation="max", redact=False), "token-classify")
    check_task_options(Request(text="t", dimensions=3), "embed")  # embed's own rules elsewhere
    refused: list[tuple[dict[str, Any], str, str]] = [
        ({"top_k": 3}, "rerank", "top_k is a sparse option"),
        ({"documents": ["d"]}, "embed", "documents is a rerank option"),
        ({"redact": True}, "classify", "redact is a token-classify option"),
        ({"chunking": {"max_tokens": 64}}, "classify", "chunking is a embed option"),
        ({}, "rerank", "needs documents"),
        ({"encoding_format": "binary"}, "sparse", "encoding_format 'binary'"),
        ({"dimensions": 8}, "sparse", "dimensions: not an option of task sparse"),
        ({"prompt_name": "query"}, "token-classify", "prompt_name"),
        ({"query": "q"}, "embed", "query is a rerank field"),  # rerank's name for text
        ({"query": "q"}, "sparse", "query is a rerank field"),
    ]
    for fields, task, message in refused:
        with pytest.raises(TaskOptionError, match=message):
            check_task_options(Request.model_validate({"text": "t", **fields}), task)  # type: ignore[arg-type]


def test_rerank_top_n_is_sorted_by_score_then_index() -> None:
    result = {"scores": [0.2, 0.9, 0.2, 0.5]}
    assert shape_task_result(result, TaskOptions()) is result
    shaped = shape_task_result(result, TaskOptions(top_n=3))
    assert shaped["top"] == [{"index": 1, "score": 0.9}, {"index": 3, "score": 0.5},
                             {"index": 0, "score": 0.2}]  # fmt: skip
    assert len(shape_task_result(result, TaskOptions(top_n=99))["top"]) == 4


def test_sparse_formats_and_top_k() -> None:
    indices = np.array([3, 10, 40, 41], dtype=np.int64)
    values = np.array([0.5, 2.0, 0.25, 2.0], dtype=np.float32)
    full = sparse_result(indices, values, dim=50)
    assert full == {"indices": [3, 10, 40, 41], "values": [0.5, 2.0, 0.25, 2.0], "dim": 50,
                    "format": "float"}  # fmt: skip
    top = sparse_result(indices, values, dim=50, top_k=3)  # ties: the lower index first
    assert (top["indices"], top["values"]) == ([3, 10, 41], [0.5, 2.0, 2.0])
    f32 = sparse_result(indices, values, dim=50, encoding_format="f32le")
    assert len(f32["indices"]) == 16 and len(f32["values"]) == 16
    f16 = sparse_result(indices, values, dim=50, encoding_format="f16le")
    got_i, got_v = decode_sparse(f16)
    assert got_i.tolist() == indices.tolist() and got_v.dtype == np.float16
    assert got_v.tolist() == values.tolist()
    with pytest.raises(ValueError, match="float, f32le or f16le"):
        sparse_result(indices, values, dim=50, encoding_format="binary")


@pytest.mark.parametrize("encoding", [Encoding.MSGPACK, Encoding.JSON])
def test_the_three_results_round_trip_on_the_wire(encoding: Encoding) -> None:
    results = [
        RerankResult(scores=[0.1, 0.7], top=[{"index": 1, "score": 0.7}]),  # type: ignore[list-item]
        SparseResult.model_validate(
            sparse_result([1, 5], [0.5, 1.5], dim=10, encoding_format="f16le")
        ),
        SparseResult.model_validate(sparse_result([1, 5], [0.5, 1.5], dim=10)),
        TokenClassifyResult.model_validate(
            {
                "entities": [{"label": "PER", "score": 0.9, "start": 0, "end": 5, "text": "Sarah"}],
                "redacted": "[PER] runs",
            }
        ),
    ]
    for result in results:
        reply = Reply(
            status="ok", result=result, model=ModelInfo(name="m"),
            timing=Timing(queue_ms=1, infer_ms=1, batch_size=1, padded_len=4),
        )  # fmt: skip
        back = decode_reply(encode_reply(reply, encoding), encoding)
        assert back.result == result
    wire = encode_reply(Reply(status="ok", result=results[0], model=ModelInfo(name="m"),
                              timing=Timing(queue_ms=1, infer_ms=1, batch_size=1, padded_len=4)),
                        Encoding.JSON)  # fmt: skip
    assert b'"top"' in wire and b"redacted" not in wire


def test_sparse_result_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="2 indices but 1 values"):
        SparseResult(indices=[1, 2], values=[0.5], dim=4)
    with pytest.raises(ValueError, match="whole uint32"):
        SparseResult(indices=b"\0" * 8, values=b"\0" * 6, dim=4, format="f32le")
    with pytest.raises(ValueError, match="beyond the scores"):
        RerankResult(scores=[0.1], top=[{"index": 3, "score": 0.1}])  # type: ignore[list-item]


def test_rerank_requests_take_query_and_at_most_64_documents() -> None:
    raw = {"query": "q", "documents": ["a", "b"], "top_n": 1}
    request = decode_request(encode_request(Request.model_validate(raw)), Encoding.MSGPACK)
    assert (request.text, request.documents, request.top_n) == ("q", ["a", "b"], 1)
    for bad, message in (
        ({"query": "q", "documents": ["d"] * (MAX_DOCUMENTS + 1)}, "at most 64"),
        ({"query": "q", "documents": []}, "at least 1"),
        ({"query": "q", "documents": [""]}, "at least 1 character"),
        ({"query": "q", "top_n": 0}, "greater than or equal to 1"),
        ({"text": "t", "aggregation": "mean"}, "aggregation"),
    ):
        with pytest.raises(ValueError, match=message):
            Request.model_validate(bad)


def test_the_committed_json_schemas_describe_the_1_2_values() -> None:
    import json
    from pathlib import Path

    import jsonschema

    root = Path(__file__).resolve().parents[2] / "schemas"
    request_schema = json.loads((root / "request.schema.json").read_text())
    reply_schema = json.loads((root / "reply.schema.json").read_text())
    jsonschema.validate({"query": "q", "documents": ["a", "b"], "top_n": 1}, request_schema)
    jsonschema.validate({"text": "t", "aggregation": "first", "redact": True}, request_schema)
    for bad in ({"documents": ["a"]}, {"text": "t", "documents": []}, {"text": "t", "top_k": 0}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, request_schema)
    timing = Timing(queue_ms=1, infer_ms=1, batch_size=1, padded_len=4)
    for result in (
        RerankResult(scores=[0.5]),
        SparseResult.model_validate(sparse_result([2], [0.5], dim=8, encoding_format="f32le")),
        TokenClassifyResult(entities=[], redacted="nothing to hide"),
    ):
        reply = Reply(status="ok", result=result, model=ModelInfo(name="m"), timing=timing)
        jsonschema.validate(json.loads(encode_reply(reply, Encoding.JSON)), reply_schema)


def test_backfill_reads_a_records_query_and_documents() -> None:
    import json

    from consumer.backfill.extract import ExtractError, extract_text

    value = json.dumps({"q": "query", "body": {"docs": ["a", "b"]}}).encode()
    got = extract_text(value, [], ("q",), documents_path=("body", "docs"))
    assert (got.text, got.documents, got.encoding) == ("query", ("a", "b"), Encoding.JSON)
    assert extract_text(value, [], ("q",)).documents is None
    for docs, message in (
        ([], "has 0 documents; 1 to 64"),
        (["a", ""], "not a list of non-empty strings"),
        ("a", "is a string, not a list"),
        (["d"] * 65, "has 65 documents"),
        (["x" * 60, "y" * 60], "at most 100 are accepted"),
    ):
        bad = json.dumps({"q": "query", "docs": docs}).encode()
        with pytest.raises(ExtractError, match=message):
            extract_text(bad, [], ("q",), documents_path=("docs",), max_text_bytes=100)


def test_backfill_settings_rerank_needs_both_fields_and_only_rerank_takes_documents() -> None:
    from pydantic import ValidationError

    from consumer.backfill.config import BackfillSettings

    base = {"source_topic": "s", "output_topic": "o"}
    ok = BackfillSettings(**base, task="rerank", text_field="q", documents_field="d", top_n=2)  # type: ignore[arg-type]
    assert ok.task_options == TaskOptions(top_n=2)
    with pytest.raises(ValidationError, match="documents at documents_field"):
        BackfillSettings(**base, task="rerank", text_field="q")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="documents_field is for task=rerank"):
        BackfillSettings(**base, documents_field="d")  # type: ignore[arg-type]
    ner = {**base, "task": "token-classify"}
    plain = BackfillSettings(**ner)  # type: ignore[arg-type]
    redacting = BackfillSettings(**ner, redact=True)  # type: ignore[arg-type]
    assert plain.effective_group_id != redacting.effective_group_id  # another job
    assert plain.effective_group_id == BackfillSettings(**ner).effective_group_id  # type: ignore[arg-type]
