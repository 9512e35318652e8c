"""OpenTelemetry tracing of kbatch (docs/TRACING.md): a request's trace continued
from the client's ``traceparent`` through its batch to the reply.

==================  ==============================================================
``settings.py``     ``TracingSettings``: ``--tracing`` (the ``OTEL_*`` variables do the rest)
``headers.py``      W3C ``traceparent``/``tracestate`` read and written (pure, no OpenTelemetry)
``provider.py``     ``open_tracer``: the SDK, OTLP/HTTP exporter, ``LinkedSampler``
``requests.py``     ``RequestTracing``: one span per request record, receipt → reply acked
``batches.py``      ``BatchTracing``: one span per model batch, linking its requests
``wiring.py``       ``open_serve_tracing``: serve's parts, built only under ``--tracing``
``log_levels.py``   the exporter's lines: one WARNING a minute for a down collector, redacted
==================  ==============================================================

Only ``provider.py``, ``requests.py`` and ``batches.py`` import OpenTelemetry (the optional
``kbatch[otel]`` extra); the rest of kbatch imports them only when tracing is on.
"""
