"""A minimal OTLP/HTTP trace receiver for the tests: ``POST /v1/traces`` with the real protobuf
(``opentelemetry-proto``'s ``ExportTraceServiceRequest``), kept in memory.

It stands in for a collector or Jaeger (which do not install from the project's registries):
what kbatch's exporter sends is decoded exactly as a backend would decode it.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, ids as hex (as in a ``traceparent``)."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    links: tuple[tuple[str, str], ...]
    """``(trace_id, span_id)`` of each link."""
    attributes: dict[str, Any]
    status_code: int
    start_ns: int
    end_ns: int


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    return None if which is None else getattr(v, which)


class OtlpReceiver:
    """Collects the spans exported to ``endpoint`` (``OTEL_EXPORTER_OTLP_ENDPOINT``)."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        got: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    got.append(
                        ReceivedSpan(
                            service=str(resource.get("service.name", "")),
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            links=tuple((lk.trace_id.hex(), lk.span_id.hex()) for lk in s.links),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            status_code=s.status.code,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self._spans.extend(got)
            self.requests += 1


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """An :class:`OtlpReceiver` on a free port of 127.0.0.1, served from a thread."""
    holder: list[OtlpReceiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            encoding = self.headers.get("Content-Encoding", "")
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            holder[0].add(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(OtlpReceiver(server))
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
