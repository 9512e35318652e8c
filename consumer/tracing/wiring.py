"""Tracing for a command, when its settings ask for it: the one entry point ``kbatch serve``
and ``kbatch backfill`` call (docs/TRACING.md).

Nothing of OpenTelemetry is imported unless ``--tracing`` is on; then a missing
``kbatch[otel]`` extra is :class:`~consumer.tracing.provider.TracingUnavailableError` (one
line for the operator, exit 1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from consumer.tracing.headers import IgnoredReason
from consumer.tracing.provider import OpenTracer, open_tracer

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from consumer.tracing.batches import BatchTracing
    from consumer.tracing.jobs import JobTrace
    from consumer.tracing.requests import RequestTracing

__all__ = [
    "BackfillTracing",
    "ServeTracing",
    "open_backfill_tracing",
    "open_serve_tracing",
    "stop_tracer",
]


@dataclass(frozen=True, slots=True)
class ServeTracing:
    """``kbatch serve``'s tracing parts: the pipeline's ``requests``, the engine's
    ``batches`` observer, and the ``tracer`` (serve's backfill jobs use it too)."""

    opened: OpenTracer
    requests: RequestTracing
    batches: BatchTracing

    @property
    def tracer(self) -> Tracer:
        return self.opened.tracer

    async def stop(self) -> None:
        """Export the last spans (off the loop) and stop the exporter."""
        await stop_tracer(self.opened)


def open_serve_tracing(
    *,
    topic: str,
    task: str,
    group: str | None,
    reply_topic: str,
    ignored: Callable[[IgnoredReason], None],
) -> ServeTracing:
    """Start tracing for ``kbatch serve`` (``reply_topic``: the configured one; ``ignored``:
    counts each trace header ignored).

    Raises:
        TracingUnavailableError: the ``kbatch[otel]`` extra is missing.
    """
    opened = open_tracer("serve")
    from consumer.tracing.batches import BatchTracing
    from consumer.tracing.requests import RequestTracing

    return ServeTracing(
        opened,
        RequestTracing(
            opened.tracer, task=task, group=group, reply_topic=reply_topic, ignored=ignored
        ),
        BatchTracing(opened.tracer, topic=topic, task=task),
    )


@dataclass(frozen=True, slots=True)
class BackfillTracing:
    """``kbatch backfill``'s tracing: the job's ``trace`` (its items carry it) and the
    engine's ``batches`` observer (each batch a child span of the job)."""

    opened: OpenTracer
    trace: JobTrace
    batches: BatchTracing

    async def finish(self, ok: bool, detail: str = "") -> None:
        """End the job's span and export what is left."""
        self.trace.end(ok, detail)
        await stop_tracer(self.opened)


def open_backfill_tracing(*, topic: str, task: str) -> BackfillTracing:
    """Start tracing for ``kbatch backfill`` of ``topic``: one trace for the run.

    Raises:
        TracingUnavailableError: the ``kbatch[otel]`` extra is missing.
    """
    opened = open_tracer("backfill")
    from consumer.tracing.batches import BatchTracing
    from consumer.tracing.jobs import start_job_span

    return BackfillTracing(
        opened,
        start_job_span(opened.tracer, topic=topic, task=task),
        BatchTracing(opened.tracer, topic=topic, task=task),
    )


async def stop_tracer(opened: OpenTracer) -> None:
    """:meth:`OpenTracer.shutdown` in a worker thread (the export may wait on the network)."""
    await asyncio.to_thread(opened.shutdown)
