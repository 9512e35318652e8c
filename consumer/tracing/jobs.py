"""Job spans: one trace per backfill run (``kbatch backfill``) or per assignment of a serve
backfill job (docs/JOBS.md), its batches as child spans.

The job span is named ``backfill <topic>`` (kind INTERNAL; ``messaging.system=kafka``,
``messaging.operation.type=process``, ``messaging.destination.name``, ``kbatch.job.id`` when
the job has one, ``kbatch.task``); the items of the job carry a :class:`JobTrace`, so each
model batch of them is a child span ``infer <topic>`` of the job
(:class:`consumer.tracing.batches.BatchTracing`). A backfill job's records are not traced one
by one: a job of millions of records is one trace of its batches.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode

__all__ = ["JobTrace", "start_job_span"]


@dataclass(frozen=True, slots=True)
class JobTrace:
    """What a job's items carry in ``InferenceItem.trace``: the job's ``span`` and the
    ``topic`` it reads (its batch spans' name)."""

    span: Span
    topic: str

    def end(self, ok: bool, detail: str = "") -> None:
        """End the job's span (``ok`` False: an ERROR status with ``detail``)."""
        if not ok and self.span.is_recording():
            self.span.set_status(StatusCode.ERROR, detail)
        self.span.end()


def start_job_span(
    tracer: trace.Tracer, *, topic: str, task: str, job_id: str | None = None
) -> JobTrace:
    """Start a job's span (a root: a job follows no request)."""
    attributes: dict[str, str] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "backfill",
        "messaging.destination.name": topic,
        "kbatch.task": task,
    }
    if job_id is not None:
        attributes["kbatch.job.id"] = job_id
    span = tracer.start_span(
        f"backfill {topic}",
        context=trace.set_span_in_context(trace.INVALID_SPAN),
        kind=SpanKind.INTERNAL,
        attributes=attributes,
    )
    return JobTrace(span, topic)
