"""Contract 1.1 options in the pipeline, with the fakes of ``test_pipeline``: what is answered
``invalid_option`` (no dead letter), what is ``invalid_request`` (dead letter), the prompt in the
model's input, and dedup that respects options."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import numpy as np
import pytest

from consumer.batching.fanout import CHUNKS
from consumer.batching.types import InferenceItem, ItemOutcome
from consumer.config import ServeSettings
from consumer.kafka.records import InRecord
from consumer.options import ModelProfile
from consumer.replies.builder import ReplyBuilder
from consumer.serve.metrics import Metrics
from consumer.serve.pipeline import Pipeline
from schemas import headers as H
from schemas.codec import Encoding, decode_reply, decode_request
from schemas.embedding import decode_embedding
from schemas.errors import DecodeError, ErrorCode
from schemas.models import ChunkedEmbedResult, EmbedResult, ModelInfo, Reply
from tests.fakes import FakeEngine, FakeSink, FakeSource
from tests.unit.test_pipeline import TP, settle

DLQ = "kbatch.requests.dlq"
PROFILE = ModelProfile(task="embed", dim=2, normalizes=True, prompts={"query": "query: "})
Parts = tuple[Pipeline, FakeSink, FakeEngine]


def request(offset: int, key: bytes = b"k", **fields: Any) -> InRecord:
    value = msgpack.packb({"text": "hello there", **fields})
    return InRecord("req", 0, offset, key, value, (), 0)


def ok(item: InferenceItem) -> ItemOutcome:
    """The runner's answer: normalised [0.6, 0.8] from the pooled [3, 4], 7 tokens."""
    return ItemOutcome(
        item_id=item.item_id,
        status="ok",
        result={"embedding": [0.6, 0.8], "dim": 2, "pooled": np.array([3.0, 4.0], np.float32)},
        error_code=None,
        error_message=None,
        truncated=False,
        n_tokens=7,
        queue_ms=1.0,
        infer_ms=2.0,
        batch_size=1,
        padded_len=7,
    )


async def make(profile: ModelProfile, task: str = "embed") -> Parts:
    settings = ServeSettings(task=task)  # type: ignore[arg-type]
    sink, engine = FakeSink(), FakeEngine()
    pipeline = Pipeline(
        settings,
        sink,
        ReplyBuilder(ModelInfo(name="fake"), settings.dlq_topic, profile),
        Metrics(),
        source=lambda _: FakeSource(),
        engine=engine,
        clock=lambda: 100.0,
        wall_clock_ms=lambda: 1_000_000,
    )
    await pipeline.on_assigned(frozenset({TP}))
    return pipeline, sink, engine


@pytest.fixture
async def parts() -> Parts:
    return await make(PROFILE)


def replies(sink: FakeSink) -> list[Reply]:
    return [decode_reply(r.value or b"", Encoding.MSGPACK) for r in sink.sent if r.topic != DLQ]


@pytest.mark.parametrize(
    "fields",
    [{"dimensions": 3}, {"prompt_name": "passage"}],
    ids=["dimensions-above-model", "unknown-prompt"],
)
async def test_an_option_the_model_cannot_honour_is_invalid_option_not_a_dead_letter(
    parts: Parts, fields: dict[str, Any]
) -> None:
    pipeline, sink, engine = parts
    await pipeline.take([request(0, **fields)])
    await settle()
    assert engine.items == []  # not computed
    assert all(r.topic != DLQ for r in sink.sent)
    (reply,) = replies(sink)
    assert reply.status == "error" and reply.error is not None
    assert reply.error.code is ErrorCode.INVALID_OPTION
    assert reply.model.contract == "1.4"


@pytest.mark.parametrize(
    "value",
    [
        {"query": "hello there"},
        {"text": "t", "query": "q"},
        {"text": "t", "top_n": 2},
        {"text": "t", "documents": ["d"]},
    ],
    ids=["query-alone", "query-and-text", "top_n", "documents"],
)
async def test_a_rerank_field_on_an_embed_model_is_invalid_option_not_a_dead_letter(
    parts: Parts, value: dict[str, Any]
) -> None:
    # query (rerank's name for text) was embedded as the text.
    pipeline, sink, engine = parts
    await pipeline.take([InRecord("req", 0, 0, b"k", msgpack.packb(value), (), 0)])
    await settle()
    assert engine.items == [] and all(r.topic != DLQ for r in sink.sent)
    (reply,) = replies(sink)
    assert reply.error is not None and reply.error.code is ErrorCode.INVALID_OPTION
    assert "a rerank" in reply.error.message and "task is embed" in reply.error.message


@pytest.mark.parametrize(
    "fields",
    [{"encoding_format": "float"}, {"normalize": True}, {"dimensions": 1}, {"prompt_name": "q"}],
)
async def test_any_embed_option_on_a_classify_model_is_invalid_option(
    fields: dict[str, Any],
) -> None:
    pipeline, sink, engine = await make(ModelProfile(task="classify"), task="classify")
    await pipeline.take([request(0, **fields)])
    await settle()
    (reply,) = replies(sink)
    assert reply.error is not None and reply.error.code is ErrorCode.INVALID_OPTION
    assert engine.items == [] and all(r.topic != DLQ for r in sink.sent)


@pytest.mark.parametrize(
    "fields",
    [
        {"dimensions": "8"},
        {"dimensions": 0},
        {"dimensions": 2.0},
        {"normalize": 1},
        {"prompt_name": 5},
        {"encoding_format": "base64"},
        {"priority": "urgent"},  # contract 1.2: live or bulk only
        {"priority": 1},
    ],
)
async def test_a_wrong_type_or_value_is_invalid_request_and_a_dead_letter(
    parts: Parts, fields: dict[str, Any]
) -> None:
    pipeline, sink, engine = parts
    await pipeline.take([request(0, **fields)])
    await settle()
    (dlq,) = [r for r in sink.sent if r.topic == DLQ]
    assert dict(dlq.headers)[H.ERROR_CODE] == b"invalid_request"
    sink.acks[0].set_result(None)  # the dead letter first, then the client's error reply
    await settle()
    (reply,) = replies(sink)
    assert reply.error is not None and reply.error.code is ErrorCode.INVALID_REQUEST
    assert engine.items == []


async def test_the_prompt_is_part_of_the_models_input_and_the_default_applies() -> None:
    profile = dataclasses.replace(PROFILE, default_prompt_name="query")
    pipeline, _, engine = await make(
        dataclasses.replace(profile, prompts={"query": "q: ", "p": "p: "})
    )
    await pipeline.take([request(0, b"a"), request(1, b"b", prompt_name="p")])
    assert [i.text for i in engine.items] == ["q: hello there", "p: hello there"]


async def test_usage_and_format_on_ok_replies(parts: Parts) -> None:
    pipeline, sink, engine = parts
    await pipeline.take([request(0)])
    pipeline.on_outcomes([ok(engine.items[0])])
    await settle()
    (reply,) = replies(sink)
    assert reply.usage is not None and reply.usage.tokens == 7
    assert isinstance(reply.result, EmbedResult) and reply.result.format == "float"
    assert reply.result.embedding == pytest.approx([0.6, 0.8])


async def test_copies_with_other_options_are_derived_from_one_computation(parts: Parts) -> None:
    pipeline, sink, engine = parts
    await pipeline.take(
        [
            request(0, b"same"),
            request(1, b"same", dimensions=1, encoding_format="f32le"),  # derived: dedup
            request(2, b"same", normalize=False),  # derived: dedup
            request(3, b"same", prompt_name="query"),  # another input: computed
        ]
    )
    assert [i.text for i in engine.items] == ["hello there", "query: hello there"]
    for item in engine.items:
        pipeline.on_outcomes([ok(item)])
    await settle()
    got = replies(sink)
    assert len(got) == 4
    computed = [r for r in got if not r.dedup]
    derived = {_tag(r): r for r in got if r.dedup}
    assert len(computed) == 2 and sorted(derived) == ["f32le", "float"]
    f32 = derived["f32le"].result
    assert isinstance(f32, EmbedResult) and f32.dim == 1
    assert decode_embedding(f32.embedding, "f32le", 1).tolist() == [1.0]  # [3] renormalised
    unnormalised = derived["float"].result
    assert isinstance(unnormalised, EmbedResult) and unnormalised.embedding == [3.0, 4.0]
    assert all(r.usage is not None and r.usage.tokens == 7 for r in got)


def _tag(reply: Reply) -> str:
    assert isinstance(reply.result, EmbedResult)
    return reply.result.format


async def test_a_finished_key_answers_a_later_copy_with_its_own_options(parts: Parts) -> None:
    pipeline, sink, engine = parts
    await pipeline.take([request(0, b"done")])
    pipeline.on_outcomes([ok(engine.items[0])])
    await settle()
    await pipeline.take([request(1, b"done", encoding_format="binary")])
    await settle()
    assert len(engine.items) == 1
    later = replies(sink)[-1]
    assert later.dedup and isinstance(later.result, EmbedResult)
    assert later.result.format == "binary" and later.result.embedding == bytes([0b11000000])


async def test_a_classify_reply_carries_usage_too() -> None:
    pipeline, sink, engine = await make(ModelProfile(task="classify"), task="classify")
    await pipeline.take([request(0)])
    result = {"label": "pos", "score": 0.75, "scores": {"neg": 0.25, "pos": 0.75}}
    pipeline.on_outcomes([dataclasses.replace(ok(engine.items[0]), result=result, n_tokens=5)])
    await settle()
    (reply,) = replies(sink)
    assert reply.status == "ok" and reply.usage is not None and reply.usage.tokens == 5


async def test_priority_picks_the_lane_and_a_retry_with_another_priority_is_the_same_request(
    parts: Parts,
) -> None:
    pipeline, sink, engine = parts
    await pipeline.take([request(0, b"a", priority="bulk"), request(1, b"b")])
    await pipeline.take([request(2, b"a", priority="live")])  # a retry of "a"
    await settle()
    # "a" rides the bulk lane; its retry joined that computation (not computed again)
    assert [(i.item_id, i.lane) for i in engine.items] == [(0, "bulk"), (1, "live")]
    pipeline.on_outcomes([ok(i) for i in engine.items])
    await settle()
    for ack in sink.acks:
        ack.set_result(None)
    await settle()
    assert len(replies(sink)) == 3
    metrics = pipeline._metrics
    lane_ok = {
        s.labels["lane"]: s.value
        for family in metrics.lane_replies.collect()
        for s in family.samples
        if s.name == "kbatch_lane_replies_total" and s.labels["status"] == "ok"
    }
    assert lane_ok == {"bulk": 1.0, "live": 2.0}  # each reply counts in its request's priority


async def test_token_classify_runs_in_windows_unless_truncate_without_redact() -> None:
    """Contract 1.3: windows by default and for every redaction (``truncate: true`` too);
    only ``truncate: true`` without ``redact`` keeps 1.2's first window — and that copy of a
    key never answers one that wants the whole text (its own dedup variant)."""
    profile = ModelProfile(task="token-classify", dim=0, normalizes=False, prompts={})
    pipeline, _, engine = await make(profile, task="token-classify")
    await pipeline.take(
        [
            request(0, b"a"),
            request(1, b"b", truncate=False),
            request(2, b"c", truncate=True, redact=True),
            request(3, b"d", truncate=True),
            request(4, b"d", truncate=True, redact=True),  # same key, wants the whole text
            request(5, b"a", truncate=True, redact=True),  # joins key a's windowed computation
        ]
    )
    assert [(i.item_id, i.windows) for i in engine.items] == [
        (0, True), (1, True), (2, True), (3, False), (4, True),
    ]  # fmt: skip


async def test_a_chunked_embed_request_runs_as_chunks_and_each_copy_gets_its_output() -> None:
    """Contract 1.3 ``chunking``: the item carries the plan (the prompt goes in front of each
    chunk, not of the text); copies with another ``output`` share the computation; one with
    another ``max_tokens`` or without chunking is another computation."""
    pipeline, sink, engine = await make(PROFILE)
    chunks = {"max_tokens": 32, "overlap": 4, "output": "chunks"}
    await pipeline.take(
        [
            request(0, b"c", prompt_name="query", chunking=chunks),
            request(1, b"c", prompt_name="query", chunking={**chunks, "output": "pooled"}),
            request(2, b"c", prompt_name="query", chunking={"max_tokens": 16}),
            request(3, b"c", prompt_name="query"),
        ]
    )
    first, other, plain = engine.items
    assert first.windows and first.text == "hello there" and first.chunking is not None
    assert (first.chunking.max_tokens, first.chunking.overlap, first.chunking.prompt) == (
        32, 4, "query: "
    )  # fmt: skip
    assert other.chunking is not None and other.chunking.max_tokens == 16
    assert not plain.windows and plain.chunking is None and plain.text == "query: hello there"
    a = {"embedding": [0.6, 0.8], "dim": 2, "pooled": np.array([3.0, 4.0], np.float32)}
    b = {"embedding": [1.0, 0.0], "dim": 2, "pooled": np.array([2.0, 0.0], np.float32)}
    gathered = {CHUNKS: ((a, 3, 0, 5), (b, 1, 6, 11))}
    pipeline.on_outcomes([dataclasses.replace(ok(first), result=gathered, n_tokens=4)])
    await settle()
    got = {r.dedup: r for r in replies(sink)}
    chunked, pooled = got[False].result, got[True].result
    assert isinstance(chunked, ChunkedEmbedResult) and chunked.dim == 2
    assert [(c.start, c.end, c.embedding) for c in chunked.chunks] == [
        (0, 5, [0.6, 0.8]), (6, 11, [1.0, 0.0])
    ]  # fmt: skip
    assert isinstance(pooled, EmbedResult)  # (3·[.6,.8] + 1·[1,0]) / 4, re-normalised
    expected = np.array([2.8, 2.4]) / np.linalg.norm([2.8, 2.4])
    assert np.allclose(pooled.embedding, expected, atol=1e-6)


@pytest.mark.parametrize(
    "chunking", [5, {"max_tokens": "8"}, {"max_tokens": 2}, {"overlap": -1}, {"output": "all"}]
)
def test_a_malformed_chunking_is_invalid_request(chunking: object) -> None:
    value = msgpack.packb({"text": "t", "chunking": chunking})
    with pytest.raises(DecodeError) as err:
        decode_request(value, Encoding.MSGPACK)
    assert err.value.code is ErrorCode.INVALID_REQUEST


def codes(sink: FakeSink) -> dict[int, str]:
    """Offset (from the request's meta) → the reply's status, or its error code."""
    got = {}
    for reply in replies(sink):
        assert reply.meta is not None
        got[reply.meta["at"]] = reply.error.code.value if reply.error else reply.status
    return got


async def test_a_reused_rerank_key_is_refused_when_the_query_or_a_document_differs() -> None:
    """Contract 1.4: a rerank request's input is its query and documents; ``top_n`` is an
    option (1.1's rule: the copy is shaped from the one computation)."""
    profile = ModelProfile(task="rerank", dim=0, normalizes=False, prompts={})
    pipeline, sink, engine = await make(profile, task="rerank")
    docs = ["In __consumer_offsets.", "Bananas are yellow."]

    def rerank(at: int, **fields: Any) -> InRecord:  # the query as "query" or as "text"
        value = msgpack.packb({**fields, "meta": {"at": at}})
        return InRecord("req", 0, at, b"r", value, (), 0)

    await pipeline.take(
        [
            rerank(0, query="where?", documents=docs),
            rerank(1, query="when?", documents=docs),
            rerank(2, query="where?", documents=docs[:1]),
            rerank(3, query="where?", documents=[docs[0], "Apples."]),
            rerank(4, text="where?", documents=docs, top_n=1),
        ]
    )
    await settle()
    assert len(engine.items) == 1 and engine.items[0].documents == tuple(docs)
    scores = {"scores": [0.9, 0.1]}
    pipeline.on_outcomes([dataclasses.replace(ok(engine.items[0]), result=scores)])
    await settle()
    reused = ErrorCode.IDEMPOTENCY_KEY_REUSED.value
    assert codes(sink) == {0: "ok", 1: reused, 2: reused, 3: reused, 4: "ok"}
    assert all(r.topic != DLQ for r in sink.sent)


async def test_a_reused_key_keeps_the_options_rule_and_compares_whole_documents(
    parts: Parts,
) -> None:
    """Copies with other options are shaped from one computation (1.1) — unless their text
    differs (1.4); one with another prompt or chunking is another input anyway, computed on its
    own; a chunked document is compared whole."""
    pipeline, sink, engine = parts
    chunks = {"max_tokens": 32}
    await pipeline.take(
        [
            request(0, b"k", meta={"at": 0}),
            request(1, b"k", dimensions=1, meta={"at": 1}),  # shaped: dedup
            request(2, b"k", text="goodbye", dimensions=1, meta={"at": 2}),  # reused
            request(3, b"k", text="goodbye", prompt_name="query", meta={"at": 3}),  # computed
            request(4, b"c", text="a long document", chunking=chunks, meta={"at": 4}),
            request(5, b"c", text="a long document.", chunking=chunks, meta={"at": 5}),
        ]
    )
    assert [i.text for i in engine.items] == ["hello there", "query: goodbye", "a long document"]
    pipeline.on_outcomes([ok(engine.items[0]), ok(engine.items[1])])
    await settle()
    reused = ErrorCode.IDEMPOTENCY_KEY_REUSED.value
    assert codes(sink) == {0: "ok", 1: "ok", 2: reused, 3: "ok", 5: reused}
    assert sorted(r.dedup for r in replies(sink)) == [False, False, False, False, True]
