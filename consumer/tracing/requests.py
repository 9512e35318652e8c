"""Request spans: one per request record, from its receipt to its reply's acknowledgement.

OpenTelemetry's messaging semantic conventions (v1.27+, "Messaging spans" and "Kafka"): the
span is named ``process <topic>``, kind CONSUMER, a child of the context in the record's
``traceparent`` (a root span when it has none), with ``messaging.system=kafka``,
``messaging.operation.type=process``, ``messaging.destination.name``,
``messaging.destination.partition.id``, ``messaging.kafka.offset``,
``messaging.kafka.message.key`` (when UTF-8), ``messaging.consumer.group.name`` and
``messaging.message.conversation_id`` (the ``kafka_correlationId``, hex). kbatch's own:
``kbatch.correlation_id``, ``kbatch.task``, ``kbatch.status``, ``kbatch.dedup``
(``in_flight``: the copy waited for the same key's computation, linked to that request's span;
``answered``: a finished key's answer reused), ``kbatch.queue_wait_ms``,
``kbatch.infer_ms``, ``kbatch.batch.size``, ``kbatch.batch.padded_length``,
``kbatch.tokens``, ``kbatch.reply.topic``; ``error.type`` (the error code: the outcome's, or
read from a reply built before compute) and an ERROR status for an ``error`` or ``expired``
reply. The span starts from the record's headers alone, before its value is decoded, so a
record that fails to decode has one too: every dead letter ends its span with
``kbatch.status=dead_letter``, and its error reply carries the ``traceparent`` as any reply.

Its reply carries the span's ``traceparent`` (and the request's ``tracestate``): the client's
reply listener continues the trace from kbatch's span. The batch span that computed it
(:mod:`consumer.tracing.batches`) links it, and it links the batch back.

Cost: the pipeline holds no :class:`RequestTracing` unless ``--tracing``;
then an unsampled request costs the header scan, a non-recording span (no attributes, no
export) and its reply's ``traceparent``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    TraceState,
)

from consumer.tracing.headers import (
    TRACEPARENT,
    TRACESTATE,
    IgnoredReason,
    TraceParent,
    format_traceparent,
    read_trace_headers,
)
from schemas.codec import Encoding, decode_reply
from schemas.headers import CONTENT_TYPE, CORRELATION_ID, last_value

if TYPE_CHECKING:
    from consumer.batching.types import ItemOutcome
    from consumer.kafka.records import InRecord
    from schemas.records import OutRecord

__all__ = ["RequestTracing", "TracedRequest"]

_ERROR_STATUSES = frozenset({"error", "expired"})


class TracedRequest(Protocol):
    """What a request tracer reads of the pipeline's ``Pending``: the span it holds in
    ``trace`` (set by :meth:`RequestTracing.received`) and its reply's ``status``."""

    trace: object | None
    status: str


class RequestTracing:
    """Makes, fills and ends request spans for ``kbatch serve`` (module docstring).

    Args:
        tracer: an OpenTelemetry tracer (:func:`consumer.tracing.provider.open_tracer`).
        task: the served task (``kbatch.task``).
        group: the consumer group (``messaging.consumer.group.name``), None for none.
        reply_topic: the configured reply topic (``--reply-topic``): ``kbatch.reply.topic`` of
            a reply whose request named none.
        ignored: called with the reason of each trace header ignored (the metric).
    """

    def __init__(
        self,
        tracer: trace.Tracer,
        *,
        task: str,
        group: str | None,
        reply_topic: str,
        ignored: Callable[[IgnoredReason], None],
    ) -> None:
        self._tracer = tracer
        self._task = task
        self._group = group
        self._reply_topic = reply_topic
        self._ignored = ignored

    def received(self, record: InRecord, correlation_id: bytes | None = None) -> Span:
        """The span of a request record just taken from Kafka (started now), from its headers
        alone: before its value is decoded, so that a record that fails to decode is traced
        too. ``correlation_id`` None: the ``kafka_correlationId`` header's (last) value."""
        if correlation_id is None:
            correlation_id = last_value(record.headers, CORRELATION_ID)
        parent = read_trace_headers(record.headers, self._ignored)
        context = None if parent is None else remote_context(parent)
        span = self._tracer.start_span(
            f"process {record.topic}", context=context, kind=SpanKind.CONSUMER
        )
        if span.is_recording():
            attributes: dict[str, str | int] = {
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": record.topic,
                "messaging.destination.partition.id": str(record.partition),
                "messaging.kafka.offset": record.offset,
                "kbatch.task": self._task,
            }
            if self._group is not None:
                attributes["messaging.consumer.group.name"] = self._group
            if record.value is not None:
                attributes["messaging.message.body.size"] = len(record.value)
            key = _text(record.key)
            if key is not None:
                attributes["messaging.kafka.message.key"] = key
            if correlation_id is not None:
                attributes["messaging.message.conversation_id"] = correlation_id.hex()
                attributes["kbatch.correlation_id"] = correlation_id.hex()
            span.set_attributes(attributes)
        return span

    def dedup(self, span: object, hit: str, of: object | None) -> None:
        """``span``'s request shares another's computation: ``hit`` is ``in_flight`` (``of``:
        the computing request's span, linked) or ``answered``."""
        assert isinstance(span, Span)
        if not span.is_recording():
            return
        span.set_attribute("kbatch.dedup", hit)
        if isinstance(of, Span):
            span.add_link(of.get_span_context(), {"kbatch.link": "dedup_of"})

    def replying(
        self,
        replies: Sequence[tuple[TracedRequest, ItemOutcome | None, bool, OutRecord]],
    ) -> None:
        """Replies just built, ``(request, outcome or None, dedup, reply record)``: each
        record gets its request span's ``traceparent``; recording spans get the outcome's
        attributes."""
        for request, outcome, dedup, record in replies:
            span = request.trace
            if not isinstance(span, Span):
                continue
            _put_trace_headers(span, record)
            if not span.is_recording():
                continue
            attributes: dict[str, str | int | float | bool] = {
                "kbatch.status": request.status,
                "kbatch.reply.topic": record.topic or self._reply_topic,
            }
            if outcome is not None and not dedup:  # a copy's batch is its original's
                attributes["kbatch.queue_wait_ms"] = round(outcome.queue_ms, 3)
                attributes["kbatch.infer_ms"] = round(outcome.infer_ms, 3)
                attributes["kbatch.batch.size"] = outcome.batch_size
                attributes["kbatch.batch.padded_length"] = outcome.padded_len
                attributes["kbatch.tokens"] = outcome.n_tokens
            code = outcome.error_code if outcome is not None else None
            if outcome is None and request.status in _ERROR_STATUSES:
                code = _error_code_of(record)  # a reply built before compute
            if code is not None:
                attributes["error.type"] = str(code)
            span.set_attributes(attributes)
            if request.status in _ERROR_STATUSES:
                span.set_status(StatusCode.ERROR, str(attributes.get("error.type", "")))

    @staticmethod
    def delivered(requests: Sequence[TracedRequest]) -> None:
        """These requests' replies were acknowledged by the broker: their spans end now."""
        end_ns = time.time_ns()
        for request in requests:
            span = request.trace
            if isinstance(span, Span):
                span.end(end_ns)
                request.trace = None  # ended once, and nothing keeps it alive

    def dead_letter_reply(self, request: TracedRequest, reply: OutRecord) -> None:
        """``reply`` is the error reply of ``request``'s dead letter (a record that failed to
        decode): it carries the request span's ``traceparent`` too, and the span its
        ``kbatch.reply.topic``."""
        span = request.trace
        if isinstance(span, Span):
            _put_trace_headers(span, reply)
            if span.is_recording():
                span.set_attribute("kbatch.reply.topic", reply.topic or self._reply_topic)

    @staticmethod
    def dead_lettered(request: TracedRequest, code: str) -> None:
        """``request`` ended in a dead letter (``code``): its span ends as an error."""
        span = request.trace
        if isinstance(span, Span):
            if span.is_recording():
                span.set_attributes({"error.type": code, "kbatch.status": "dead_letter"})
                span.set_status(StatusCode.ERROR, code)
            span.end()
            request.trace = None


def _put_trace_headers(span: Span, record: OutRecord) -> None:
    """Put ``span``'s ``traceparent`` (and its ``tracestate``: the request's, when valid) on
    ``record``."""
    ctx = span.get_span_context()
    if not ctx.is_valid:  # OTEL_SDK_DISABLED: no span, nothing to continue
        return
    record.headers.append(
        (TRACEPARENT, format_traceparent(ctx.trace_id, ctx.span_id, ctx.trace_flags))
    )
    if ctx.trace_state:
        record.headers.append((TRACESTATE, ctx.trace_state.to_header().encode("ascii")))


def _error_code_of(record: OutRecord) -> str | None:
    """The ``error.code`` in a reply record's value (None when it has none or is unreadable)."""
    if record.value is None:
        return None
    try:
        encoding = Encoding.from_content_type(last_value(record.headers, CONTENT_TYPE))
        error = decode_reply(record.value, encoding).error
    except Exception:  # a span attribute is never worth a reply
        return None
    return None if error is None else str(error.code.value)


def remote_context(parent: TraceParent) -> Context:
    """The context of the remote span ``parent`` names (its ``tracestate`` valid already:
    :func:`~consumer.tracing.headers.read_trace_headers`)."""
    state = TraceState.from_header([parent.tracestate]) if parent.tracestate else None
    remote = SpanContext(
        parent.trace_id,
        parent.span_id,
        is_remote=True,
        trace_flags=TraceFlags(parent.flags & 0xFF),
        trace_state=state,
    )
    return trace.set_span_in_context(NonRecordingSpan(remote))


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return None
