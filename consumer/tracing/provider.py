"""Start OpenTelemetry for one kbatch process: an SDK tracer provider exporting over OTLP/HTTP.

The SDK reads its standard variables itself (the OpenTelemetry specification's "SDK
Environment Variables"): ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_
ENDPOINT`` (default ``http://localhost:4318``), ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (default ``parentbased_always_on``),
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (kbatch's default service name is
``kbatch``), ``OTEL_BSP_SCHEDULE_DELAY`` and the other batch span processor limits. The span
export runs in the SDK's own thread, never on the event loop.

The OpenTelemetry packages are the optional extra ``kbatch[otel]``: they are imported only
here, when tracing is asked for (:class:`TracingUnavailableError` when missing).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from consumer.tracing.log_levels import quiet_export_errors, redact_url

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "OpenTracer",
    "TracingUnavailableError",
    "check_tracing",
    "open_tracer",
]

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "kbatch"
"""``service.name`` unless ``OTEL_SERVICE_NAME`` (or ``service.name`` in
``OTEL_RESOURCE_ATTRIBUTES``) says otherwise."""

SHUTDOWN_TIMEOUT_MS = 5_000
"""At most this long the exit waits for the last spans to be exported."""


class TracingUnavailableError(RuntimeError):
    """Tracing was asked for and the ``kbatch[otel]`` extra is not installed."""


@dataclass(frozen=True, slots=True)
class OpenTracer:
    """A started provider and kbatch's tracer from it (``instrumentation scope`` ``kbatch``)."""

    provider: TracerProvider
    tracer: Tracer

    def shutdown(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS) -> bool:
        """Export what is buffered and stop the export thread, within ``timeout_ms`` in all;
        True when done in time. Idempotent.

        The SDK's own shutdown is not bounded (its ``force_flush`` ignores its timeout and a
        collector that accepts and never answers holds each export for the exporter's 10 s
        ``OTEL_EXPORTER_OTLP_TIMEOUT``; a shutdown could wait ~20 s), so it runs in a daemon
        thread given ``timeout_ms``: past it the spans still buffered are given up (one
        WARNING) and the thread dies with the process.
        """
        closing = threading.Thread(
            target=self.provider.shutdown, name="kbatch-otel-shutdown", daemon=True
        )
        closing.start()
        closing.join(timeout_ms / 1000)
        if closing.is_alive():
            log.warning(
                "tracing: the last spans were not exported within %d ms (collector not "
                "answering?); given up",
                timeout_ms,
            )
            return False
        return True


def check_tracing() -> None:
    """Raise :class:`TracingUnavailableError` unless the ``kbatch[otel]`` extra is installed
    (``kbatch serve --tracing`` checks before anything starts, replicas included)."""
    _sdk()


def _sdk() -> tuple[Any, Any, Any, Any]:
    """The SDK's ``OTLPSpanExporter``, ``Resource``, ``TracerProvider``, ``BatchSpanProcessor``.

    Raises:
        TracingUnavailableError: the OpenTelemetry SDK or its OTLP/HTTP exporter is missing
            (the message names the distribution, from the module that failed to import).
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as err:
        missing = ", ".join(_missing_distributions()) or f"module {err.name}"
        raise TracingUnavailableError(
            "--tracing needs the OpenTelemetry SDK and its OTLP/HTTP exporter: pip install "
            f"'kbatch[otel]' (missing: {missing})"
        ) from None
    return OTLPSpanExporter, Resource, TracerProvider, BatchSpanProcessor


_EXTRA_MODULES = {
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
}
"""The ``kbatch[otel]`` extra: a module of each distribution, and the distribution."""


def _missing_distributions() -> list[str]:
    """The distributions of the ``kbatch[otel]`` extra that are not installed (each checked:
    an ``ImportError`` names only the first module missing, which may be a namespace
    package's child when another OpenTelemetry distribution is installed)."""
    missing = []
    for module, distribution in _EXTRA_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # its parent package is missing
            found = False
        if not found:
            missing.append(distribution)
    return missing


def open_tracer(component: str) -> OpenTracer:
    """Start the SDK from the ``OTEL_*`` environment for ``component`` (``serve``,
    ``backfill``: the resource's ``kbatch.component``).

    The sampler is the environment's, wrapped so that a span with no parent that *links* a
    sampled span is sampled too (:class:`LinkedSampler`: a batch span exists for the sampled
    requests in it, whatever the ratio).

    Raises:
        TracingUnavailableError: the OpenTelemetry SDK or its OTLP/HTTP exporter is missing.
    """
    OTLPSpanExporter, Resource, TracerProvider, BatchSpanProcessor = _sdk()
    attributes: dict[str, str] = {"kbatch.component": component}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        attributes["service.name"] = DEFAULT_SERVICE_NAME
    quiet_export_errors()
    # shutdown_on_exit=False: OpenTracer.shutdown is the one, bounded, shutdown (the SDK's
    # atexit hook would wait again, unbounded, for a collector that never answers).
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    provider.sampler = LinkedSampler.wrap(provider.sampler)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    tracer = provider.get_tracer("kbatch")
    _warn_ignored_settings()
    log.info(
        "tracing on: %s to %s",
        provider.sampler.get_description(),
        redact_url(
            os.environ.get(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"),
            )
        ),
    )
    return OpenTracer(provider, tracer)


def _warn_ignored_settings() -> None:
    """Say what in the ``OTEL_*`` environment kbatch does not follow: a protocol other than
    OTLP/HTTP protobuf (the extra ships that exporter only), the SDK switched off."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = os.environ.get(name)
        if protocol and protocol != "http/protobuf":
            log.warning(
                "%s=%s is not followed: kbatch exports OTLP over HTTP/protobuf", name, protocol
            )
            break
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        log.warning("OTEL_SDK_DISABLED=true: --tracing records and exports no spans")


class LinkedSampler:
    """Samples a root span that links a sampled span; otherwise asks the configured sampler.

    OpenTelemetry's messaging conventions make the span of a batch that processes many
    messages a span of its own that *links* each message's context: with a ratio sampler
    it would be sampled at random, independently of the requests in it. Under this rule
    every sampled request's batch is exported and a batch of unsampled requests never is.
    Built by :meth:`wrap` (subclassing the SDK's ``Sampler`` needs the SDK at import).
    """

    @staticmethod
    def wrap(inner: Any) -> Any:
        from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
        from opentelemetry.trace import get_current_span

        class _Linked(Sampler):
            def should_sample(
                self,
                parent_context: Any,
                trace_id: int,
                name: str,
                kind: Any = None,
                attributes: Any = None,
                links: Sequence[Any] | None = None,
                trace_state: Any = None,
            ) -> SamplingResult:
                parent = get_current_span(parent_context).get_span_context()
                if links and not parent.is_valid:
                    if any(link.context.trace_flags.sampled for link in links):
                        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
                    return SamplingResult(Decision.DROP)
                return inner.should_sample(  # type: ignore[no-any-return]
                    parent_context, trace_id, name, kind, attributes, links, trace_state
                )

            def get_description(self) -> str:
                return f"LinkedSampler{{{inner.get_description()}}}"

        return _Linked()
