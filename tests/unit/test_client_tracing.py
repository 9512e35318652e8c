"""The client's trace headers: the current span's traceparent goes out with a
request; a reply's traceparent becomes the parent of the client's next span; ``kbatch load
--traceparent`` names its slowest requests' traces."""

from __future__ import annotations

import numpy as np
from opentelemetry.sdk.trace import TracerProvider

from producer_tools.load import SLOWEST_TRACES, slowest_traces
from producer_tools.report import RunLog
from producer_tools.tracing import (
    current_trace_headers,
    new_trace_headers,
    reply_context,
    reply_traceparent,
)

KBATCH_SPAN = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_current_spans_traceparent_is_sent_and_nothing_outside_a_span() -> None:
    tracer = TracerProvider().get_tracer("test")
    assert current_trace_headers() == []
    with tracer.start_as_current_span("client") as span:
        ctx = span.get_span_context()
        (header,) = current_trace_headers()
    assert header == (
        "traceparent",
        f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}".encode(),
    )


def test_a_replys_traceparent_parents_the_clients_next_span() -> None:
    headers = [("kafka_correlationId", b"c"), ("traceparent", KBATCH_SPAN.encode())]
    assert reply_traceparent(headers) == KBATCH_SPAN
    assert reply_traceparent([("kafka_correlationId", b"c")]) is None
    tracer = TracerProvider().get_tracer("test")
    span = tracer.start_span("handle reply", context=reply_context(headers))
    assert span.parent is not None  # type: ignore[attr-defined]
    assert f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"  # type: ignore[attr-defined]
    assert f"{span.get_span_context().trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_new_trace_is_sampled_with_random_ids() -> None:
    trace_a, [(name, value)] = new_trace_headers()
    trace_b, _ = new_trace_headers()
    assert name == "traceparent" and trace_a != trace_b
    version, trace_id, span_id, flags = value.decode().split("-")
    assert (version, trace_id, flags, len(span_id)) == ("00", trace_a, "01", 16)


def test_the_load_report_names_the_slowest_answered_traces_first() -> None:
    n = SLOWEST_TRACES + 2
    log = RunLog.empty(np.zeros(n))
    log.received_s[:] = np.arange(n) / 1000.0  # request i took i ms
    log.received_s[n - 1] = np.nan  # never answered: not named
    traces = {i: f"t{i}" for i in range(n)}
    slowest = slowest_traces(log, traces, np.ones(n, dtype=bool))
    assert [t["trace_id"] for t in slowest] == [f"t{i}" for i in range(n - 2, 0, -1)][
        :SLOWEST_TRACES
    ]
    assert slowest[0]["latency_ms"] == float(n - 2)


def test_the_slowest_traces_leave_out_the_warm_up() -> None:
    n = SLOWEST_TRACES + 3
    log = RunLog.empty(np.zeros(n))
    log.received_s[:] = np.arange(n)[::-1] / 1000.0  # the first (warm-up) requests slowest
    measured = np.arange(n) >= 3  # three warm-up requests, as the statistics exclude them
    slowest = slowest_traces(log, {i: f"t{i}" for i in range(n)}, measured)
    assert [t["trace_id"] for t in slowest] == [f"t{i}" for i in range(3, 3 + SLOWEST_TRACES)]
