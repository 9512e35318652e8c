"""The tracing settings group (docs/TRACING.md): one switch; the rest is OpenTelemetry's own.

Part of ``kbatch serve``'s and ``kbatch backfill``'s settings (``--tracing/--no-tracing``,
``KBATCH_TRACING``). Where spans go, which are sampled and the service's name are read by the
OpenTelemetry SDK from its standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``, ``OTEL_SERVICE_NAME``, ...): kbatch
defines no second name for any of them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TracingSettings"]


class TracingSettings(BaseModel):
    """OpenTelemetry tracing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tracing: bool = Field(
        False,
        description="Export OpenTelemetry traces over OTLP/HTTP (needs `pip install "
        "kbatch[otel]`; the OTEL_* variables set the endpoint, sampler and service name; "
        "docs/TRACING.md).",
    )
