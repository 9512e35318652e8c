"""``kbatch load --metrics-url``: checked once before the run (a
/healthz URL failing mid-run with "Invalid labels" and a refused connection ignored)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from producer_tools.load import metric_sums, metrics_url_problem

PAGES = {
    "/metrics": b"# TYPE kbatch_tokens_real_total counter\nkbatch_tokens_real_total 12.0\n"
    b"# TYPE kbatch_tokens_padded_total counter\nkbatch_tokens_padded_total 16.0\n",
    "/other": b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n",
    "/healthz": b'{"alive": true, "loop_lag_s": 0.001}',
}


class _Pages(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = PAGES[self.path]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_kbatch_metrics_page_passes_and_sums(base_url: str) -> None:
    assert metrics_url_problem(f"{base_url}/metrics") is None
    assert metric_sums(f"{base_url}/metrics", ("kbatch_tokens_real_total",)) == {
        "kbatch_tokens_real_total": 12.0
    }


def test_a_page_without_kbatch_counters_is_named(base_url: str) -> None:
    problem = metrics_url_problem(f"{base_url}/other")
    assert problem is not None and "no kbatch token counters" in problem


def test_a_page_that_is_not_prometheus_text_is_refused_not_raised(base_url: str) -> None:
    assert metric_sums(f"{base_url}/healthz", ("x",)) is None  # was: ValueError mid-run
    problem = metrics_url_problem(f"{base_url}/healthz")
    assert problem is not None and "cannot read a Prometheus page" in problem


def test_a_refused_connection_is_named() -> None:
    problem = metrics_url_problem("http://127.0.0.1:1/metrics", timeout_s=1)
    assert problem is not None and "127.0.0.1:1" in problem
