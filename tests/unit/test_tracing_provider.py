"""The tracer provider's process-level behaviour: a
bounded shutdown against a collector that never answers, no credentials in its log lines, one
WARNING a minute (never an ERROR) while the collector is down, and a missing extra named."""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import time
from collections.abc import Iterator

import pytest

from consumer.tracing.log_levels import ExportLogFilter, redact_url, redact_urls
from consumer.tracing.provider import TracingUnavailableError, check_tracing, open_tracer

EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


@pytest.fixture
def blackhole() -> Iterator[str]:
    """An HTTP endpoint that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # the kernel completes connections; nothing reads or writes
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_shutdown_is_bounded_when_the_collector_never_answers(
    blackhole: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", blackhole)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    opened = open_tracer("serve")
    opened.tracer.start_span("one").end()
    start_s = time.monotonic()
    assert opened.shutdown(timeout_ms=500) is False  # given up: the export never ended
    assert time.monotonic() - start_s < 2.0  # the SDK alone waits 10 s per export, twice


def test_the_start_up_line_names_the_endpoint_without_its_credentials(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://kbuser:S3cretPw@127.0.0.1:9?t=tok")
    with caplog.at_level(logging.INFO, logger="consumer.tracing.provider"):
        opened = open_tracer("serve")
    opened.shutdown(timeout_ms=100)
    assert "tracing on:" in caplog.text
    assert "S3cretPw" not in caplog.text and "kbuser" not in caplog.text
    assert "tok" not in caplog.text
    assert "***@127.0.0.1:9" in caplog.text


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://u:p@h:4318/v1/traces", "http://***@h:4318/v1/traces"),
        ("https://h/v1/traces?api_key=x", "https://h/v1/traces?***"),
        ("http://[::1]:4318", "http://[::1]:4318"),
        ("http://u@[::1]:4318", "http://***@[::1]:4318"),
        ("http://localhost:4318", "http://localhost:4318"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_urls(f"POST {url} failed") == f"POST {shown} failed"


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@contextlib.contextmanager
def quieted(name: str, caplog: pytest.LogCaptureFixture) -> Iterator[tuple[logging.Logger, Clock]]:
    """A logger with an :class:`ExportLogFilter` on a fake clock, captured at INFO."""
    clock, logger = Clock(), logging.getLogger(name)
    quiet = ExportLogFilter(clock)
    logger.addFilter(quiet)
    try:
        with caplog.at_level(logging.INFO, logger=name):
            yield logger, clock
    finally:
        logger.removeFilter(quiet)


def emit(logger: logging.Logger, level: int, msg: str, *args: object) -> None:
    logger.handle(logger.makeRecord(logger.name, level, __file__, 0, msg, args, None))


def test_a_down_collector_is_one_warning_a_minute_with_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with quieted("test.otel.exporter", caplog) as (logger, clock):
        for second in range(125):  # the exporter's lines for 125 s of a collector down
            clock.now_s = float(second)
            emit(
                logger,
                logging.WARNING,
                "Transient error %s encountered while exporting %s batch, retrying in %.2fs.",
                "Max retries exceeded with url: http://u:pw@h:4318/v1/traces",
                "span",
                1.0,
            )
            if second % 9 == 8:
                emit(
                    logger,
                    logging.ERROR,
                    "Failed to export %s batch due to timeout, max retries or shutdown.",
                    "span",
                )
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.levelno for r in lines] == [logging.WARNING] * 3  # at 0 s, 60 s, 120 s
    assert "spans are being dropped" in lines[1].getMessage()
    assert "6 span batches dropped, 60 export retries" in lines[1].getMessage()
    assert all("pw" not in r.getMessage() for r in lines)


def test_another_exporter_error_keeps_its_level_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with quieted("test.otel.exporter2", caplog) as (logger, clock):
        for second in range(3):
            clock.now_s = float(second)
            emit(logger, logging.ERROR, "Failed to export %s batch code: %s", "span", 401)
    assert [r.levelno for r in caplog.records if r.levelno >= logging.INFO] == [logging.ERROR]


def test_a_missing_extra_names_the_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if nothing of it were installed
    with pytest.raises(TracingUnavailableError) as err:
        check_tracing()
    assert str(err.value).endswith(
        "(missing: opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)"
    )


def test_a_missing_exporter_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m.startswith("opentelemetry.exporter.otlp.proto.http")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(TracingUnavailableError) as err:
        check_tracing()
    assert str(err.value).endswith("(missing: opentelemetry-exporter-otlp-proto-http)")


def test_a_bare_path_query_is_redacted_as_urllib3_names_the_url() -> None:
    line = "Max retries exceeded with url: /v1/traces?api_key=topsecret (Caused by x)"
    assert redact_urls(line) == "Max retries exceeded with url: /v1/traces?*** (Caused by x)"
    assert "topsecret" not in redact_urls("url: /?api_key=topsecret/v1/traces")


def test_settings_kbatch_does_not_follow_are_named_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    with caplog.at_level(logging.WARNING, logger="consumer.tracing.provider"):
        opened = open_tracer("serve")
    opened.shutdown(timeout_ms=100)
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not followed" in caplog.text


def test_a_span_without_a_valid_context_puts_no_traceparent_on_the_reply() -> None:
    from opentelemetry.trace import INVALID_SPAN

    from consumer.tracing.requests import _put_trace_headers
    from schemas.records import OutRecord

    reply = OutRecord(topic="t", partition=None, key=b"k", value=b"v", headers=[])
    _put_trace_headers(INVALID_SPAN, reply)  # type: ignore[arg-type]
    assert reply.headers == []  # not 00-000…0-000…0-00, a header kbatch itself refuses
