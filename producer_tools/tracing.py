"""Trace context for kbatch's clients (docs/TRACING.md, CONTRACT.md §Trace headers).

A request carries W3C ``traceparent``/``tracestate`` headers; kbatch's request span is their
child and its reply carries kbatch's span's ``traceparent``. This module makes the headers and
reads the reply's, with or without OpenTelemetry:

* :func:`current_trace_headers`: the headers of the caller's current OpenTelemetry span
  (``opentelemetry-api``'s global propagator); ``[]`` without ``opentelemetry-api`` or outside
  a span. :class:`~producer_tools.client.RequestReplyClient` sends them by default.
* :func:`new_trace_headers`: a fresh sampled trace of its own (``kbatch load --traceparent``).
* :func:`reply_traceparent` / :func:`reply_context`: a reply's ``traceparent`` as text, or as an
  OpenTelemetry ``Context`` to start the client's next span in (``tracer.start_span(...,
  context=reply_context(envelope.record.headers))``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "current_trace_headers",
    "new_trace_headers",
    "reply_context",
    "reply_traceparent",
]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACE_HEADERS = (TRACEPARENT, TRACESTATE)


@functools.cache
def _propagate() -> Any:
    """``opentelemetry.propagate``, or None when ``opentelemetry-api`` is not installed."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return None
    return propagate


def current_trace_headers() -> list[tuple[str, bytes]]:
    """``traceparent`` (and ``tracestate``) of the current OpenTelemetry context, as Kafka
    headers; ``[]`` without ``opentelemetry-api`` or without a valid current span."""
    propagate = _propagate()
    if propagate is None:
        return []
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(name, carrier[name].encode("ascii")) for name in _TRACE_HEADERS if name in carrier]


def new_trace_headers() -> tuple[str, list[tuple[str, bytes]]]:
    """A fresh sampled trace: ``(trace id in hex, [("traceparent", ...)])`` — the request is
    the trace's first span as far as kbatch knows (random ids, as the recommendation asks)."""
    trace_id = os.urandom(16).hex()
    span_id = os.urandom(8).hex()
    return trace_id, [(TRACEPARENT, f"00-{trace_id}-{span_id}-01".encode("ascii"))]


def reply_traceparent(headers: Iterable[tuple[str, bytes | None]]) -> str | None:
    """The reply's ``traceparent`` (kbatch's request span) as text; None when it has none
    (kbatch runs without ``--tracing``)."""
    found: bytes | None = None
    for name, value in headers:
        if name == TRACEPARENT:
            found = value
    return None if found is None else found.decode("ascii", "replace")


def reply_context(headers: Iterable[tuple[str, bytes | None]]) -> Any:
    """An OpenTelemetry ``Context`` whose remote parent is the reply's span (kbatch's request
    span), to continue the trace in: ``tracer.start_span("handle reply", context=...)``.

    Raises:
        RuntimeError: ``opentelemetry-api`` is not installed.
    """
    propagate = _propagate()
    if propagate is None:
        raise RuntimeError("reply_context needs opentelemetry-api: pip install 'kbatch[otel]'")
    carrier = {
        name: value.decode("ascii", "replace")
        for name, value in headers
        if name in _TRACE_HEADERS and value is not None
    }
    return propagate.extract(carrier)
