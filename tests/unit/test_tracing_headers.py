"""W3C trace headers on request records: what is used, what is ignored and counted
(bad or oversized trace headers never fail a request)."""

from __future__ import annotations

import pytest

from consumer.tracing.headers import (
    MAX_TRACEPARENT_BYTES,
    MAX_TRACESTATE_BYTES,
    IgnoredReason,
    TraceParent,
    format_traceparent,
    read_trace_headers,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
GOOD = f"00-{TRACE}-{SPAN}-01".encode()


def read(*headers: tuple[str, bytes | None]) -> tuple[TraceParent | None, list[IgnoredReason]]:
    reasons: list[IgnoredReason] = []
    return read_trace_headers(headers, reasons.append), reasons


def test_a_valid_traceparent_is_read_with_its_tracestate() -> None:
    parent, reasons = read(
        ("kafka_correlationId", b"x"),
        ("traceparent", GOOD),
        ("tracestate", b"congo=t61rcWkgMzE"),
        ("tracestate", b"rojo=00f067aa0ba902b7"),
    )
    assert reasons == []
    assert parent == TraceParent(
        int(TRACE, 16), int(SPAN, 16), 1, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    )
    assert parent.sampled


def test_no_trace_headers_is_no_context_and_nothing_counted() -> None:
    assert read(("content-type", b"application/json")) == (None, [])
    assert read(("traceparent", None)) == (None, [])  # a null value is no header


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ((("traceparent", GOOD), ("traceparent", GOOD)), "repeated"),
        ((("traceparent", b"0" * (MAX_TRACEPARENT_BYTES + 1)),), "oversized"),
        ((("traceparent", GOOD[:-2] + "é".encode()),), "encoding"),
        ((("traceparent", b"\xff\xfe" + GOOD[2:]),), "encoding"),
        ((("traceparent", b"garbage"),), "invalid"),
        ((("traceparent", GOOD.upper()),), "invalid"),  # hex must be lowercase
        ((("traceparent", f"00-{'0' * 32}-{SPAN}-01".encode()),), "invalid"),
        ((("traceparent", f"00-{TRACE}-{'0' * 16}-01".encode()),), "invalid"),
        ((("traceparent", b"ff" + GOOD[2:]),), "invalid"),  # version ff is forbidden
        ((("traceparent", GOOD + b"-extra"),), "invalid"),  # version 00 is exactly 55
        ((("traceparent", b"01" + GOOD[2:] + b"x"),), "invalid"),
    ],
)
def test_a_bad_traceparent_is_ignored_and_its_reason_counted(
    headers: tuple[tuple[str, bytes], ...], reason: IgnoredReason
) -> None:
    assert read(*headers) == (None, [reason])


def test_a_later_version_with_more_fields_is_read() -> None:
    parent, reasons = read(("traceparent", b"01" + GOOD[2:] + b"-what-comes-next"))
    assert reasons == [] and parent is not None and parent.span_id == int(SPAN, 16)


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (b"a=" + b"b" * MAX_TRACESTATE_BYTES, "oversized"),
        ("a=é".encode(), "encoding"),
        (b"a=b\n", "invalid"),
        (b"garbage", "invalid"),
        (b"Upper=1", "invalid"),  # keys are lower case
        (b"a=1,a=2", "invalid"),  # a key twice
        (b"a=b =c", "invalid"),  # '=' in a value
        (b"a=", "invalid"),  # an empty value
        (",".join(f"k{i}=v" for i in range(33)).encode(), "invalid"),  # over 32 members
    ],
)
def test_a_bad_tracestate_is_dropped_and_the_traceparent_kept(
    state: bytes, reason: IgnoredReason
) -> None:
    parent, reasons = read(("traceparent", GOOD), ("tracestate", state))
    assert reasons == [reason]
    assert parent == TraceParent(int(TRACE, 16), int(SPAN, 16), 1, None)


def test_a_valid_tracestate_is_normalised() -> None:
    members = ",".join(f"k{i}=v" for i in range(30))  # 32 in all: the most allowed
    parent, reasons = read(
        ("traceparent", GOOD),
        ("tracestate", b" a=1 ,, t@sys=x y\t"),
        ("tracestate", members.encode()),
    )
    assert reasons == []
    assert parent is not None and parent.tracestate == "a=1,t@sys=x y," + members


def test_an_invalid_tracestate_never_reaches_the_sdk_parser(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from consumer.tracing.requests import remote_context

    for state in (b"garbage", b"a=1,a=2", ",".join(f"k{i}=v" for i in range(33)).encode()):
        parent, _ = read(("traceparent", GOOD), ("tracestate", state))
        assert parent is not None
        with caplog.at_level("DEBUG", logger="opentelemetry"):
            remote_context(parent)
    assert caplog.records == []  # OpenTelemetry logs a WARNING per bad list it parses


def test_a_reply_traceparent_round_trips() -> None:
    value = format_traceparent(int(TRACE, 16), int(SPAN, 16), 1)
    assert value == GOOD
    assert read(("traceparent", value)) == (TraceParent(int(TRACE, 16), int(SPAN, 16), 1), [])


def test_tracing_without_the_otel_extra_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from consumer.tracing.provider import TracingUnavailableError, check_tracing, open_tracer

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    with pytest.raises(TracingUnavailableError, match=r"pip install 'kbatch\[otel\]'"):
        open_tracer("serve")
    with pytest.raises(TracingUnavailableError, match="opentelemetry"):
        check_tracing()  # serve's check before anything starts (replicas too)
