"""The OpenTelemetry exporter's log lines about a collector that does not answer: one WARNING
a minute, with counts, never an ERROR; and no endpoint credentials in any line.

With the collector down (or unreachable) the OTLP/HTTP exporter (opentelemetry-exporter-otlp
1.45, ``opentelemetry/exporter/otlp/common/http.py``) logs a WARNING ``Transient error …
encountered while exporting span batch, retrying in …s`` for every retry (about one a
second) and an ERROR ``Failed to export span batch due to timeout, max retries or shutdown``
for every batch given up (every 8–10 s); the SDK's batch processor logs ``Queue full,
dropping span`` when spans pile up meanwhile. Left alone that is a log flood, and
docs/operations.md says an ERROR line asks for an operator, while kbatch keeps serving (spans are
best-effort). As kbatch does for aiokafka's retried errors
(:mod:`consumer.kafka.log_levels`), :class:`ExportLogFilter` turns these lines into one
WARNING per :data:`REPEAT_AFTER_S` — ``trace export failing …, spans are being dropped: N
span batches dropped, M export retries, K spans dropped on a full queue since the last such
line`` with the last error — the lines in between DEBUG. The exporter's other lines (a
collector that answers 4xx, a batch that cannot be encoded) keep their level, each at most
once per :data:`REPEAT_AFTER_S` (the rest DEBUG). Every line passing through has the userinfo
and query of any URL in it redacted (:func:`redact_urls`).

:func:`quiet_export_errors` installs one filter on each of :data:`EXPORT_LOGGERS`;
idempotent.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable
from typing import Final
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "EXPORT_LOGGERS",
    "ExportLogFilter",
    "quiet_export_errors",
    "redact_url",
    "redact_urls",
]

EXPORT_LOGGERS: Final = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",  # the HTTP client logs through it
    "opentelemetry.sdk._shared_internal",  # the batch processor: queue full, export raised
    "opentelemetry.sdk.trace.export",
)
"""The OpenTelemetry loggers that log about span export (SDK and exporter 1.45's sources)."""

REPEAT_AFTER_S: Final = 60.0
"""One WARNING about a failing export per this many seconds (the rest DEBUG)."""

_EXPORT_FAILING: Final = (
    ("Transient error", "retries"),
    ("due to timeout, max retries or shutdown", "batches"),
    ("Queue full, dropping", "spans"),
    ("Shutdown in progress, aborting retry", "retries"),
)
"""A message template's marker and what it counts: the lines of a collector not answering."""

_URL_RE: Final = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()]+")
_PATH_QUERY_RE: Final = re.compile(r"(/[^\s'\"<>()?]*)\?[^\s'\"<>()]+")
"""A path with a query and no scheme (urllib3's ``Max retries exceeded with url: /v1/traces?…``)."""


def redact_url(url: str) -> str:
    """``url`` without credentials: its userinfo (``user:password@``) becomes ``***@`` and a
    query string ``?***`` (an OTLP endpoint may carry a token in either)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    query = "***" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def redact_urls(text: str) -> str:
    """``text`` with every URL in it passed through :func:`redact_url`, and the query of every
    bare path (``/v1/traces?api_key=…``, as urllib3 names a URL) ``?***``."""
    return _PATH_QUERY_RE.sub(r"\1?***", _URL_RE.sub(lambda m: redact_url(m.group(0)), text))


class ExportLogFilter(logging.Filter):
    """The export lines of the module docstring, rate-limited and redacted.

    Args:
        clock: Monotonic seconds (``time.monotonic``; a fake clock in tests). Two WARNINGs
            about a failing export (and two lines of any other one template) are
            :data:`REPEAT_AFTER_S` apart at least; the lines in between are DEBUG.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._counts = {"batches": 0, "retries": 0, "spans": 0}
        self._failing_since_s: float | None = None
        self._warned_s: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        template = str(record.msg)
        counted = next((what for marker, what in _EXPORT_FAILING if marker in template), None)
        now_s = self._clock()
        if counted is not None:
            self._counts[counted] += 1
            if self._failing_since_s is None:
                self._failing_since_s = now_s
            if self._due(" failing", now_s):
                self._summarise(record, now_s)
                return True
        elif self._due(template, now_s):
            record.msg, record.args = redact_urls(record.getMessage()), ()
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)

    def _due(self, line: str, now_s: float) -> bool:
        last_s = self._warned_s.get(line)
        if last_s is not None and now_s - last_s < REPEAT_AFTER_S:
            return False
        if len(self._warned_s) >= 256:
            self._warned_s.clear()
        self._warned_s[line] = now_s
        return True

    def _summarise(self, record: logging.LogRecord, now_s: float) -> None:
        """Make ``record`` the WARNING about the failing export since the last one."""
        assert self._failing_since_s is not None
        last_error = redact_urls(record.getMessage())[:300]
        c = self._counts
        if now_s == self._failing_since_s:  # the first line of a failure
            record.msg = (
                "trace export failing (OTLP collector not answering?), spans will be dropped "
                "while it lasts (one line a minute, with counts); first: %s"
            )
            record.args = (last_error,)
        else:
            record.msg = (
                "trace export failing (OTLP collector not answering?), spans are being "
                "dropped: %d span batches dropped, %d export retries, %d spans dropped on a "
                "full queue since the last such line, %.0f s ago; last: %s"
            )
            record.args = (
                c["batches"],
                c["retries"],
                c["spans"],
                now_s - self._failing_since_s,
                last_error,
            )
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        self._counts = {"batches": 0, "retries": 0, "spans": 0}
        self._failing_since_s = now_s


@functools.cache
def quiet_export_errors() -> ExportLogFilter:
    """Install the filter on each of :data:`EXPORT_LOGGERS` once; the installed filter."""
    quiet = ExportLogFilter()
    for name in EXPORT_LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    return quiet
