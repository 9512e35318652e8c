"""A discarding OTLP/HTTP endpoint for ``kbatch bench e2e``'s traced variants: it answers every
``POST /v1/traces`` with 200 and counts the requests and bytes, decoding nothing (a collector
on the same host would cost its own CPU; this one costs as little as an endpoint can)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["OtlpSink", "otlp_sink"]


@dataclass
class OtlpSink:
    """``endpoint`` (``OTEL_EXPORTER_OTLP_ENDPOINT``) and what was posted to it so far."""

    endpoint: str
    requests: int = 0
    bytes: int = 0


@contextmanager
def otlp_sink() -> Iterator[OtlpSink]:
    """An :class:`OtlpSink` on a free port of 127.0.0.1, served from a thread."""
    lock = threading.Lock()
    sink = OtlpSink("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(size)
            with lock:
                sink.requests += 1
                sink.bytes += size
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sink.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="otlp-sink", daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
