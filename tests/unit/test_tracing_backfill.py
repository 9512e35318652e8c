"""A backfill job under ``--tracing``: one trace per job, its model batches
as child spans of the job's span; the records themselves are not traced one by one."""

from __future__ import annotations

import asyncio
import json
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from consumer.backfill.config import BackfillSettings
from consumer.backfill.job import BackfillJob
from consumer.batching.types import Batch, TokenizedItem
from consumer.kafka.records import InRecord
from consumer.replies.builder import ReplyBuilder
from consumer.tracing.batches import BatchTracing
from consumer.tracing.jobs import start_job_span
from schemas.models import ModelInfo
from tests.fakes import AnsweringEngine, FakeRangeSource, FakeSink


async def test_a_jobs_batches_are_child_spans_of_the_job() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    trace = start_job_span(tracer, topic="events", task="embed")
    records = [
        InRecord("events", 0, o, b"k", json.dumps({"text": f"t{o}"}).encode(), (), 0)
        for o in range(3)
    ]
    settings = BackfillSettings(
        source_topic="events", output_topic="scores", dlq_topic="dead", text_field="text"
    )
    job = BackfillJob(
        settings,
        FakeRangeSource({0: records}, ends={0: 3}),
        FakeSink(auto_ack=True),
        ReplyBuilder(ModelInfo(name="m"), "dead"),
        engine=(engine := AnsweringEngine()),
        trace=trace,
    )
    summary = await job.run(asyncio.Event())
    assert summary.complete
    assert [item.trace for item in engine.submitted] == [trace] * 3
    now = time.monotonic()
    batch = Batch([TokenizedItem(item, [1, 2], 2, False) for item in engine.submitted], 2, now)
    BatchTracing(tracer, topic="kbatch.requests", task="embed")(batch, now - 0.01, now)
    trace.end(summary.complete)

    (job_span,) = [s for s in exporter.get_finished_spans() if s.name == "backfill events"]
    (batch_span,) = [s for s in exporter.get_finished_spans() if s.name == "infer events"]
    assert batch_span.parent is not None
    assert batch_span.parent.span_id == job_span.context.span_id
    assert batch_span.attributes is not None
    assert batch_span.attributes["messaging.batch.message_count"] == 3
    assert batch_span.links == ()
    assert job_span.status.is_ok
