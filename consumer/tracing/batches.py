"""Batch spans: one per model batch, linking the request spans of the items in it.

OpenTelemetry's messaging conventions ("Batch receiving"/"Batch processing"): an operation on
many messages is a span of its own that *links* each message's context, since it has no one
parent. kbatch's batch span is named ``infer <topic>`` (``messaging.operation.name=infer``,
``messaging.operation.type=process``, kind INTERNAL), spans the model's run of the batch
(start to results on the host: monotonic engine times turned into Unix nanoseconds), and
carries ``messaging.batch.message_count`` (distinct requests), ``kbatch.batch.size``
(sequences: a rerank pair or a window is one), ``kbatch.batch.padded_length``,
``kbatch.batch.padded_tokens``, ``kbatch.batch.real_tokens``, ``kbatch.lane`` and
``kbatch.task``. Each recording request span gets a link back to it (``kbatch.link=batch``).

It exists only when a sampled request is in the batch (the links decide its sampling:
:class:`consumer.tracing.provider.LinkedSampler`); a batch of untraced items costs one pass
over its items (``item.trace`` None). A batch of a backfill job's items (they carry a
:class:`~consumer.tracing.jobs.JobTrace`) is a child span of the job's span instead.
"""

from __future__ import annotations

import logging
import time

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind

from consumer.batching.types import Batch
from consumer.tracing.jobs import JobTrace

__all__ = ["MAX_LINKS", "BatchTracing"]

log = logging.getLogger(__name__)

MAX_LINKS = 128
"""Links per batch span at most (the SDK's default ``OTEL_SPAN_LINK_COUNT_LIMIT``); a larger
batch's span names its first 128 sampled requests, and each of those requests links it."""


class BatchTracing:
    """The engine's batch observer (``Engine(..., on_batch_run=...)``) making batch spans.

    Args:
        tracer: an OpenTelemetry tracer.
        topic: the request topic (the span's name and ``messaging.destination.name``).
        task: the served task.
    """

    def __init__(self, tracer: trace.Tracer, *, topic: str, task: str) -> None:
        self._tracer = tracer
        self._topic = topic
        self._task = task

    def __call__(self, batch: Batch, start_s: float, end_s: float) -> None:
        """``batch`` ran on the model from ``start_s`` to ``end_s`` (monotonic seconds)."""
        spans: dict[int, Span] = {}
        job: JobTrace | None = None
        for t in batch.items:
            span = t.item.trace
            if isinstance(span, Span):
                if span.is_recording():
                    spans.setdefault(id(span), span)
            elif isinstance(span, JobTrace):  # a batch never mixes lanes: all of one job
                job = span
        if not spans and (job is None or not job.span.is_recording()):
            return
        try:
            self._record(batch, list(spans.values())[:MAX_LINKS], job, start_s, end_s)
        except Exception:  # a span is never worth a batch
            log.exception("batch span not recorded")

    def _record(
        self, batch: Batch, requests: list[Span], job: JobTrace | None, start_s: float, end_s: float
    ) -> None:
        epoch_ns = time.time_ns() - time.monotonic_ns()
        real = sum(t.n_tokens for t in batch.items)
        parent = trace.INVALID_SPAN if job is None else job.span  # requests: linked, no parent
        topic = self._topic if job is None else job.topic
        span = self._tracer.start_span(
            f"infer {topic}",
            context=trace.set_span_in_context(parent),
            kind=SpanKind.INTERNAL,
            links=[Link(s.get_span_context(), {"kbatch.link": "request"}) for s in requests],
            start_time=epoch_ns + int(start_s * 1e9),
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.operation.name": "infer",
                "messaging.destination.name": topic,
                "messaging.batch.message_count": _requests_in(batch),
                "kbatch.batch.size": len(batch.items),
                "kbatch.batch.padded_length": batch.padded_len,
                "kbatch.batch.padded_tokens": batch.padded_tokens,
                "kbatch.batch.real_tokens": real,
                "kbatch.lane": batch.items[0].item.lane,
                "kbatch.task": self._task,
            },
        )
        span.end(epoch_ns + int(end_s * 1e9))
        batch_ctx = span.get_span_context()
        for request in requests:
            request.add_link(batch_ctx, {"kbatch.link": "batch"})


def _requests_in(batch: Batch) -> int:
    """Distinct requests in ``batch``: a rerank pair or a window shares its request's span;
    an item without one (a backfill job's record) counts alone."""
    traced = {id(t.item.trace) for t in batch.items if isinstance(t.item.trace, Span)}
    return len(traced) + sum(1 for t in batch.items if not isinstance(t.item.trace, Span))
