"""Request and batch spans through the pipeline, with fakes for Kafka and the engine and the
SDK's in-memory exporter: a request's span continues its ``traceparent``, ends at
the broker's ack, is linked by its batch's span; its reply carries the span's
``traceparent``; a dedup copy has its own span; bad trace headers are counted, never fail."""

from __future__ import annotations

import time

import msgpack
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, DEFAULT_ON, ParentBased
from opentelemetry.trace import SpanKind

from consumer.batching.types import Batch, InferenceItem, TokenizedItem
from consumer.config import ServeSettings
from consumer.kafka.records import InRecord
from consumer.replies.builder import ReplyBuilder
from consumer.serve.metrics import Metrics
from consumer.serve.pipeline import Pipeline
from consumer.tracing.batches import BatchTracing
from consumer.tracing.provider import LinkedSampler
from consumer.tracing.requests import RequestTracing
from schemas import headers as H
from schemas.models import ModelInfo
from tests.fakes import FakeEngine, FakeSink, FakeSource
from tests.unit.test_pipeline import TP, ok, settle

TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CLIENT_SPAN = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE:032x}-{CLIENT_SPAN:016x}-01".encode()


def record(offset: int, key: bytes, *headers: tuple[str, bytes]) -> InRecord:
    """A request of ``key`` (records of one key are copies: the text is the key's)."""
    body = msgpack.packb({"text": f"text of {key!r}"})
    return InRecord("req", 0, offset, key, body, (*headers, (H.CORRELATION_ID, b"c%d" % offset)), 0)


class Traced:
    def __init__(self, sampler: object = DEFAULT_ON) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=LinkedSampler.wrap(sampler))
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = provider.get_tracer("test")
        self.metrics = Metrics()
        self.requests = RequestTracing(
            self.tracer,
            task="embed",
            group="kbatch",
            reply_topic=ServeSettings().reply_topic,
            ignored=lambda reason: self.metrics.trace_headers_ignored.labels(reason).inc(),
        )
        self.batches = BatchTracing(self.tracer, topic="req", task="embed")

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def ignored(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "kbatch_trace_headers_ignored_total", {"reason": reason}
        )
        return value or 0.0


async def traced_pipeline(
    traced: Traced, settings: ServeSettings | None = None
) -> tuple[Pipeline, FakeSink, FakeEngine]:
    settings = settings if settings is not None else ServeSettings()
    sink, engine = FakeSink(), FakeEngine()
    pipeline = Pipeline(
        settings,
        sink,
        ReplyBuilder(ModelInfo(name="fake"), settings.dlq_topic),
        traced.metrics,
        source=lambda _: FakeSource(),
        engine=engine,
        clock=lambda: 100.0,
        wall_clock_ms=lambda: 1_000_000,
        tracing=traced.requests,
    )
    await pipeline.on_assigned(frozenset({TP}))
    return pipeline, sink, engine


def run_batch(traced: Traced, items: list[InferenceItem]) -> None:
    """The engine's observer call for ``items`` run as one batch."""
    now = time.monotonic()
    tokenized = [TokenizedItem(item, [1, 2, 3, 4], 4, False) for item in items]
    traced.batches(Batch(tokenized, 4, now), now - 0.002, now)


def traceparent_of(headers: list[tuple[str, bytes | None]]) -> tuple[int, int]:
    (value,) = [v for k, v in headers if k == "traceparent"]
    assert value is not None
    _, trace_id, span_id, flags = value.decode().split("-")
    assert flags == "01"
    return int(trace_id, 16), int(span_id, 16)


async def test_a_request_span_continues_the_clients_trace_and_its_reply_carries_it() -> None:
    traced = Traced()
    pipeline, sink, engine = await traced_pipeline(traced)
    await pipeline.take(
        [
            record(0, b"a", ("traceparent", TRACEPARENT), ("tracestate", b"v=1")),
            record(1, b"a"),  # a copy in flight: its own span, no computation
            record(2, b"b", ("traceparent", b"not a traceparent")),
        ]
    )
    assert len(engine.items) == 2
    assert all(item.trace is not None for item in engine.items)
    run_batch(traced, engine.items)
    pipeline.on_outcomes([ok(item) for item in engine.items])
    await settle()
    assert len(sink.sent) == 3  # the bad header failed nothing
    assert traced.spans("process req") == []  # open until the broker's ack
    for ack in sink.acks:
        ack.set_result(None)
    await settle()

    requests = {s.attributes["messaging.kafka.offset"]: s for s in traced.spans("process req")}
    assert sorted(requests) == [0, 1, 2]
    first = requests[0]
    assert first.kind is SpanKind.CONSUMER
    assert first.parent is not None and first.parent.span_id == CLIENT_SPAN
    assert first.context.trace_id == TRACE
    assert first.context.trace_state.get("v") == "1"
    assert first.attributes["messaging.system"] == "kafka"
    assert first.attributes["messaging.destination.partition.id"] == "0"
    assert first.attributes["messaging.kafka.message.key"] == "a"
    assert first.attributes["kbatch.correlation_id"] == b"c0".hex()
    assert first.attributes["kbatch.status"] == "ok"
    assert first.attributes["kbatch.batch.size"] == 1
    reply = next(r for r in sink.sent if H.last_value(r.headers, H.CORRELATION_ID) == b"c0")
    assert traceparent_of(reply.headers) == (TRACE, first.context.span_id)
    assert ("tracestate", b"v=1") in reply.headers

    copy = requests[1]
    assert copy.attributes["kbatch.dedup"] == "in_flight"
    assert [link.context.span_id for link in copy.links] == [first.context.span_id]
    assert copy.parent is None  # no traceparent: a trace of its own

    assert requests[2].parent is None
    assert traced.ignored("invalid") == 1

    (batch,) = traced.spans("infer req")
    assert batch.parent is None
    linked = {link.context.span_id for link in batch.links}
    assert linked == {requests[0].context.span_id, requests[2].context.span_id}
    assert batch.attributes["messaging.batch.message_count"] == 2
    assert batch.attributes["kbatch.batch.padded_length"] == 4
    assert batch.context.span_id in {link.context.span_id for link in first.links}


async def test_every_request_span_names_its_reply_topic_the_configured_one_too() -> None:
    """``kbatch.reply.topic`` (docs/TRACING.md): the topic a request named, else the configured
    ``--reply-topic``; an error reply to a record that failed to decode included."""
    traced = Traced()
    settings = ServeSettings(allowed_reply_topics=r"replies\..*")
    pipeline, sink, engine = await traced_pipeline(traced, settings)
    undecodable = InRecord("req", 0, 2, b"c", msgpack.packb({"v": 9, "text": "x"}), (), 0)
    await pipeline.take(
        [record(0, b"a"), record(1, b"b", (H.REPLY_TOPIC, b"replies.mine")), undecodable]
    )
    pipeline.on_outcomes([ok(item) for item in engine.items])
    await ack_all(sink)
    spans = {s.attributes["messaging.kafka.offset"]: s for s in traced.spans("process req")}
    assert {
        offset: span.attributes.get("kbatch.reply.topic") for offset, span in spans.items()
    } == {
        0: settings.reply_topic,
        1: "replies.mine",
        2: settings.reply_topic,
    }


async def test_a_dead_lettered_request_ends_its_span_as_an_error() -> None:
    traced = Traced()
    pipeline, sink, _ = await traced_pipeline(traced)
    bad_topic = (H.REPLY_TOPIC, b"kbatch.requests")  # the request topic: refused
    await pipeline.take([record(0, b"a", ("traceparent", TRACEPARENT), bad_topic)])
    await settle()
    for ack in sink.acks:
        ack.set_result(None)
    await settle()
    (span,) = traced.spans("process req")
    assert span.status.is_ok is False
    assert span.attributes["kbatch.status"] == "dead_letter"


async def test_an_unsampled_request_exports_nothing_yet_its_reply_carries_a_traceparent() -> None:
    traced = Traced(ParentBased(ALWAYS_OFF))
    pipeline, sink, engine = await traced_pipeline(traced)
    unsampled = TRACEPARENT[:-2] + b"00"
    await pipeline.take([record(0, b"a", ("traceparent", unsampled))])
    run_batch(traced, engine.items)
    pipeline.on_outcomes([ok(engine.items[0])])
    await settle()
    for ack in sink.acks:
        ack.set_result(None)
    await settle()
    assert traced.exporter.get_finished_spans() == ()
    (value,) = [v for k, v in sink.sent[0].headers if k == "traceparent"]
    assert value is not None and value.startswith(f"00-{TRACE:032x}-".encode())
    assert value.endswith(b"-00")


async def test_without_tracing_nothing_is_attached() -> None:
    settings = ServeSettings()
    sink, engine = FakeSink(auto_ack=True), FakeEngine()
    pipeline = Pipeline(
        settings,
        sink,
        ReplyBuilder(ModelInfo(name="fake"), settings.dlq_topic),
        Metrics(),
        source=lambda _: FakeSource(),
        engine=engine,
    )
    await pipeline.on_assigned(frozenset({TP}))
    await pipeline.take([record(0, b"a", ("traceparent", TRACEPARENT))])
    assert engine.items[0].trace is None
    pipeline.on_outcomes([ok(engine.items[0])])
    await settle()
    assert [k for k, _ in sink.sent[0].headers if k == "traceparent"] == []


async def ack_all(sink: FakeSink) -> None:
    """Acknowledge every record sent, until nothing more is sent (a dead letter's reply
    follows its dead letter's ack)."""
    for _ in range(5):
        for ack in sink.acks:
            if not ack.done():
                ack.set_result(None)
        await settle()


UNDECODABLE = [
    msgpack.packb({"v": 1, "text": ""}),
    msgpack.packb({"v": 9, "text": "x"}),
    msgpack.packb({"v": 1}),
    b"\xc1\xc1",
]


async def test_a_record_that_fails_to_decode_is_traced_and_its_error_reply_carries_it() -> None:
    traced = Traced()
    settings = ServeSettings(allowed_reply_topics=r"replies\..*")
    pipeline, sink, _ = await traced_pipeline(traced, settings)
    records = [
        InRecord(
            "req",
            0,
            offset,
            None,
            value,
            [
                (H.REPLY_TOPIC, b"replies.mine"),
                (H.CORRELATION_ID, b"c%d" % offset),
                ("traceparent", TRACEPARENT),
                ("tracestate", b"v=1"),
            ],
            0,
        )
        for offset, value in enumerate(UNDECODABLE)
    ]
    await pipeline.take(records)
    await ack_all(sink)

    spans = {s.attributes["kbatch.correlation_id"]: s for s in traced.spans("process req")}
    assert sorted(spans) == [(b"c%d" % i).hex() for i in range(4)]
    replies = sink.to("replies.mine")
    assert len(replies) == 4
    for reply in replies:
        correlation_id = H.last_value(reply.headers, H.CORRELATION_ID)
        assert correlation_id is not None
        span = spans[correlation_id.hex()]
        assert span.parent is not None and span.parent.span_id == CLIENT_SPAN
        assert span.attributes["kbatch.status"] == "dead_letter"
        assert span.attributes["error.type"] in {"invalid_request", "unsupported_version"}
        assert span.status.is_ok is False
        assert traceparent_of(reply.headers) == (TRACE, span.context.span_id)
        assert ("tracestate", b"v=1") in reply.headers


async def test_a_reply_built_before_compute_gives_its_span_the_error_code() -> None:
    traced = Traced()
    pipeline, sink, _ = await traced_pipeline(traced)

    def request(offset: int, **fields: object) -> InRecord:
        body = msgpack.packb({"v": 1, "text": "t", **fields})
        headers = [(H.CORRELATION_ID, b"c%d" % offset), ("traceparent", TRACEPARENT)]
        return InRecord("req", 0, offset, b"k%d" % offset, body, headers, 0)

    await pipeline.take(
        [
            request(0, deadline_ms=1_000),  # the fake wall clock is at 1,000,000 ms
            request(1, task="rerank"),  # this consumer serves embed
            request(2, prompt_name="nope"),  # the model has no such prompt
        ]
    )
    await ack_all(sink)
    spans = {s.attributes["messaging.kafka.offset"]: s for s in traced.spans("process req")}
    assert {k: s.attributes["kbatch.status"] for k, s in spans.items()} == {
        0: "expired",
        1: "error",
        2: "error",
    }
    assert spans[0].attributes["error.type"] == "deadline_exceeded"
    assert spans[1].attributes["error.type"] == "unsupported_task"
    assert spans[2].attributes["error.type"] == "invalid_option"
    for span in spans.values():
        assert span.status.description == span.attributes["error.type"]
