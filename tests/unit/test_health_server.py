"""The health server's HTTP thread: a client that hangs up mid-answer is counted, not a
traceback on stderr (a probe that timed out, a test harness that closed its pipe)."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from consumer.serve.metrics import HealthServer

BODY_BYTES = 8 * 1024 * 1024  # far above the socket buffers: the write meets the reset


class _BlockingMetrics:
    """Renders a large body once the test says the client has gone."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.client_gone = threading.Event()

    def render(self) -> bytes:
        self.asked.set()
        self.client_gone.wait(10)
        return b"x" * BODY_BYTES

    def refresh(self, now_s: float) -> None:
        return


def test_a_client_that_hangs_up_mid_answer_is_counted_without_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    metrics = _BlockingMetrics()
    server = HealthServer(metrics, lambda: (True, {}), port=0)
    server.start()
    try:
        client = socket.create_connection(("127.0.0.1", server.port))
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert metrics.asked.wait(10)
        # close with a reset (linger 0): the server's write then fails at once
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        metrics.client_gone.set()
        deadline = time.monotonic() + 10
        while server.hangups == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # polls a counter another thread sets, with a deadline
    finally:
        server.stop()
    assert server.hangups == 1
    assert "Traceback" not in capsys.readouterr().err
