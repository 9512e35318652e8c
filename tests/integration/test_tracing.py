"""Tracing end to end: a real ``kbatch serve --tracing``, the real broker, and an
OTLP/HTTP receiver decoding the real protobuf. A client span → kbatch's request span (its
child) → the batch span (linking it) → the reply's ``traceparent`` continued by the client, for
embed and for a contract 1.2 task (rerank), with and without dedup; a bad ``traceparent`` is
ignored, counted, and the request answered; ``kbatch backfill --tracing`` and a job run by
serve are one trace of their batches; ``kbatch load --traceparent`` names traces kbatch
continued."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Span, Tracer

from consumer.kafka.admin import create_topics, delete_topics
from producer_tools.client import ReplyEnvelope, RequestReplyClient
from producer_tools.load import SLOWEST_TRACES, LoadOptions, run_load
from tests.conftest import TopicFactory, unique_group
from tests.fixtures.task_models import build_tiny_cross_encoder
from tests.integration.harness import ServeProcess
from tests.integration.otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.integration.test_backfill import Event, backfill_args, produce_events, run_backfill
from tests.integration.test_backfill_jobs import Members
from tests.integration.test_backfill_jobs import _source as job_source
from tests.integration.test_backfill_jobs import _submit as submit_job
from tests.integration.test_backfill_jobs import _wait_status as wait_job_status

DOCUMENTS = ["Consumers commit offsets to Kafka.", "Bananas are yellow."]
SPAN_KIND_CONSUMER = 5  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_CONSUMER


@pytest.fixture
def topics(kafka_bootstrap: str) -> Iterator[tuple[str, str, str]]:
    suffix = unique_group("t").rsplit(".", 1)[-1]
    names = [f"test.trace-{n}.{suffix}" for n in ("req", "rep", "dlq")]
    asyncio.run(create_topics(kafka_bootstrap, names, partitions=1))
    try:
        yield names[0], names[1], names[2]
    finally:
        asyncio.run(delete_topics(kafka_bootstrap, names))


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """The receiver, and the variables ``kbatch serve`` reads to export to it quickly."""
    with otlp_receiver() as got:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", got.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "kbatch-test")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
        yield got


def client_tracer(receiver: OtlpReceiver) -> tuple[Tracer, TracerProvider]:
    provider = TracerProvider(resource=Resource.create({"service.name": "test-client"}))
    exporter = OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), provider


@dataclass(frozen=True)
class Setting:
    """A test's directory, the broker, its topics (requests, replies, dead letters) and the
    OTLP receiver."""

    tmp_path: Path
    bootstrap: str
    topics: tuple[str, str, str]
    receiver: OtlpReceiver


@pytest.fixture
def setting(
    tmp_path: Path, kafka_bootstrap: str, topics: tuple[str, str, str], receiver: OtlpReceiver
) -> Setting:
    return Setting(tmp_path, kafka_bootstrap, topics, receiver)


@contextlib.asynccontextmanager
async def traced_serve(
    setting: Setting,
    model: Path,
    task: str = "embed",
    extra: tuple[str, ...] = ("--max-wait-ms", "5"),
) -> AsyncIterator[tuple[ServeProcess, RequestReplyClient, Tracer]]:
    """A ready ``kbatch serve --tracing``, a client on its topics and a client tracer, all
    exporting to the receiver; stopped (the last spans flushed) on the way out."""
    requests, replies, dlq = setting.topics
    bootstrap = setting.bootstrap
    server = ServeProcess.start(
        setting.tmp_path,
        bootstrap=bootstrap,
        request_topic=requests,
        reply_topic=replies,
        dlq_topic=dlq,
        group_id=unique_group("trace"),
        model=str(model),
        task=task,
        extra=[*extra, "--tracing"],
    )
    tracer, provider = client_tracer(setting.receiver)
    try:
        server.wait_ready()
        async with RequestReplyClient(
            bootstrap=bootstrap, request_topic=requests, reply_topic=replies
        ) as client:
            yield server, client, tracer
    finally:
        server.stop()
        provider.shutdown()


def wait_for(
    receiver: OtlpReceiver, found: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30
) -> list[ReceivedSpan]:
    deadline = time.monotonic() + timeout_s
    while True:
        spans = receiver.spans()
        if found(spans):
            return spans
        if time.monotonic() > deadline:
            names = sorted((s.service, s.name) for s in spans)
            raise AssertionError(f"spans not exported within {timeout_s} s; got {names}")
        time.sleep(0.1)


def ids(span: Span) -> tuple[str, str]:
    ctx = span.get_span_context()
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def reply_ids(env: ReplyEnvelope) -> tuple[str, str]:
    assert env.traceparent is not None, "the reply carries no traceparent"
    _, trace_id, span_id, _ = env.traceparent.split("-")
    return trace_id, span_id


@pytest.mark.parametrize("task", ["embed", "rerank"])
async def test_a_trace_follows_a_request_through_kbatch_and_back(
    task: str, setting: Setting, tiny_embed_dir: Path
) -> None:
    requests, receiver = setting.topics[0], setting.receiver
    model = tiny_embed_dir
    if task == "rerank":
        model = build_tiny_cross_encoder(setting.tmp_path / "ce")
    options = {"documents": DOCUMENTS} if task == "rerank" else {}
    async with traced_serve(setting, model, task) as (server, client, tracer):
        with tracer.start_as_current_span("client request") as first:
            computed = await client.request("where are offsets?", "k", **options)
        with tracer.start_span("handle reply", context=computed.trace_context()) as handled:
            pass
        with tracer.start_as_current_span("client retry") as second:
            copy = await client.request("where are offsets?", "k", **options)
        bad = await client.request(
            "no trace", "bad", trace_headers=[("traceparent", b"00-junk")], **options
        )
        assert computed.reply.status == "ok" and not computed.reply.dedup
        assert copy.reply.status == "ok" and copy.reply.dedup
        assert bad.reply.status == "ok"
        assert server.metrics()['kbatch_trace_headers_ignored_total{reason="invalid"}'] == 1

    trace_id, client_span = ids(first)
    process = f"process {requests}"

    def kbatch_spans(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [s for s in spans if s.service == "kbatch-test" and s.name == process]

    spans = wait_for(
        receiver,
        lambda got: (
            len(kbatch_spans(got)) >= 3
            and any(s.name == f"infer {requests}" for s in got)
            and any(s.name == "handle reply" for s in got)
        ),
    )
    # 1. kbatch's request span is the client span's child
    (request_span,) = [s for s in kbatch_spans(spans) if s.parent_span_id == client_span]
    assert request_span.trace_id == trace_id
    assert request_span.kind == SPAN_KIND_CONSUMER
    attributes = request_span.attributes
    assert attributes["messaging.system"] == "kafka"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == requests
    assert attributes["messaging.kafka.message.key"] == "k"
    assert attributes["kbatch.task"] == task and attributes["kbatch.status"] == "ok"
    assert attributes["kbatch.batch.size"] >= 1
    assert attributes["kbatch.correlation_id"] == computed.record.correlation_id.hex()
    # 2. the batch span links it (and it links the batch back)
    (batch,) = [s for s in spans if (trace_id, request_span.span_id) in s.links]
    assert batch.name == f"infer {requests}" and batch.service == "kbatch-test"
    assert batch.parent_span_id == ""  # a root: its requests are links
    assert batch.attributes["messaging.batch.message_count"] >= 1
    expected_size = len(DOCUMENTS) if task == "rerank" else 1  # each pair is one sequence
    assert batch.attributes["kbatch.batch.size"] >= expected_size
    assert (batch.trace_id, batch.span_id) in request_span.links
    # 3. the reply carries kbatch's span; the client continues the trace from it
    assert reply_ids(computed) == (trace_id, request_span.span_id)
    (reply_handling,) = [s for s in spans if s.name == "handle reply"]
    assert reply_handling.span_id == ids(handled)[1]
    assert reply_handling.parent_span_id == request_span.span_id
    assert reply_handling.trace_id == trace_id
    # 4. a dedup copy: its own request span, the retry's child, and its reply's traceparent
    retry_trace, retry_span = ids(second)
    (copy_span,) = [s for s in kbatch_spans(spans) if s.parent_span_id == retry_span]
    assert copy_span.attributes["kbatch.dedup"] == "answered"
    assert reply_ids(copy) == (retry_trace, copy_span.span_id)
    # 5. the bad traceparent was ignored: a trace of kbatch's own, the request answered
    bad_trace, bad_span = reply_ids(bad)
    (bad_request,) = [s for s in kbatch_spans(spans) if s.span_id == bad_span]
    assert bad_request.parent_span_id == "" and bad_request.trace_id == bad_trace


async def test_a_copy_in_flight_links_the_request_it_waited_for(
    setting: Setting, tiny_embed_dir: Path
) -> None:
    """Two requests with one key sent together: the copy's span (the second client span's
    child) links the computing request's span; both replies carry their own span."""
    requests, receiver = setting.topics[0], setting.receiver
    # a long wait: the copy arrives while the first is still queued
    slow = ("--max-wait-ms", "500", "--no-adaptive-wait")
    async with traced_serve(setting, tiny_embed_dir, extra=slow) as (_, client, tracer):
        with tracer.start_as_current_span("first") as first:
            task_a = asyncio.create_task(client.request("same text", "same"))
        with tracer.start_as_current_span("second") as second:
            task_b = asyncio.create_task(client.request("same text", "same"))
        env_a, env_b = await asyncio.gather(task_a, task_b)
    assert sorted([env_a.reply.dedup, env_b.reply.dedup]) == [False, True]
    spans = wait_for(
        receiver,
        lambda got: sum(s.name == f"process {requests}" for s in got) >= 2,
    )
    by_parent = {s.parent_span_id: s for s in spans if s.name == f"process {requests}"}
    span_a, span_b = by_parent[ids(first)[1]], by_parent[ids(second)[1]]
    computing, waiting = (span_a, span_b) if not env_a.reply.dedup else (span_b, span_a)
    assert waiting.attributes["kbatch.dedup"] == "in_flight"
    assert (computing.trace_id, computing.span_id) in waiting.links
    assert "kbatch.dedup" not in computing.attributes
    assert reply_ids(env_a) == (span_a.trace_id, span_a.span_id)
    assert reply_ids(env_b) == (span_b.trace_id, span_b.span_id)


async def test_a_backfill_is_one_trace_of_its_batches(
    tmp_path: Path,
    kafka_bootstrap: str,
    new_topic: TopicFactory,
    receiver: OtlpReceiver,
    tiny_embed_dir: Path,
) -> None:
    """``kbatch backfill --tracing``: the job's span, each model batch its child."""
    source = await new_topic("bf-src")
    output, dlq = await new_topic("bf-out"), await new_topic("bf-dlq")
    texts = [f"event number {i}" for i in range(12)]
    await produce_events(
        kafka_bootstrap, source, [Event(0, b"k%d" % i, t.encode()) for i, t in enumerate(texts)]
    )
    args = backfill_args(
        kafka_bootstrap, source, output, dlq, unique_group("bf"), tiny_embed_dir, "--tracing"
    )
    run = run_backfill(args, tmp_path / "backfill.log")
    assert run.code == 0, run.log[-3000:]
    assert run.summary is not None and run.summary["ok"] == len(texts)
    spans = wait_for(
        receiver, lambda got: any(s.name == f"backfill {source}" for s in got), timeout_s=10
    )
    (job,) = [s for s in spans if s.name == f"backfill {source}"]
    assert job.service == "kbatch-test" and job.parent_span_id == ""
    batches = [s for s in spans if s.name == f"infer {source}"]
    assert batches and all(b.parent_span_id == job.span_id for b in batches)
    assert all(b.trace_id == job.trace_id for b in batches)
    assert sum(b.attributes["messaging.batch.message_count"] for b in batches) == len(texts)


async def test_kbatch_load_traceparent_names_traces_kbatch_continued(setting: Setting) -> None:
    """``kbatch load --traceparent``: each request starts a trace; the report's slowest trace
    ids are the traces of kbatch's request spans (children of the load's span ids)."""
    requests, replies, _ = setting.topics
    async with traced_serve(setting, Path("noop")) as _:
        run = await run_load(
            LoadOptions(
                bootstrap=setting.bootstrap,
                request_topic=requests,
                reply_topic=replies,
                texts=["a short text", "another one"],
                rate_per_s=20,
                count=10,
                warmup_s=0,
                traceparent=True,
            ),
            progress=False,
        )
    slowest = run.report["slowest_traces"]
    assert len(slowest) == SLOWEST_TRACES
    assert slowest == sorted(slowest, key=lambda t: -t["latency_ms"])
    wanted = {t["trace_id"] for t in slowest}
    spans = wait_for(
        setting.receiver,
        lambda got: wanted <= {s.trace_id for s in got if s.name == f"process {requests}"},
    )
    parents = {s.trace_id: s.parent_span_id for s in spans if s.trace_id in wanted}
    assert all(parent != "" for parent in parents.values())  # the load's span, remote


async def test_a_serve_backfill_job_is_a_trace_of_its_batches(
    setting: Setting, tiny_embed_dir: Path
) -> None:
    """A job run by ``kbatch serve --tracing`` (docs/JOBS.md): the member's assignment is a
    ``backfill <source>`` span naming the job, each batch of it a child span."""
    jobs_topic = f"{setting.topics[0]}.jobs"
    extra = ("--max-wait-ms", "5", "--jobs-topic", jobs_topic)
    async with traced_serve(setting, tiny_embed_dir, extra=extra) as (server, _, _):
        members = Members(setting.bootstrap, tiny_embed_dir, jobs_topic, [server], [jobs_topic])
        try:
            source, output = await job_source(members, 1, 20)
            job = submit_job(members, source, output)
            await wait_job_status(members, job, lambda s: s.state == "completed", 60)
        finally:
            await delete_topics(setting.bootstrap, members.topics)
    spans = wait_for(setting.receiver, lambda got: any(s.name == f"backfill {source}" for s in got))
    (assignment,) = [s for s in spans if s.name == f"backfill {source}"]
    assert assignment.attributes["kbatch.job.id"] == job
    batches = [s for s in spans if s.name == f"infer {source}"]
    assert batches and all(b.parent_span_id == assignment.span_id for b in batches)
    assert sum(b.attributes["messaging.batch.message_count"] for b in batches) == 20
