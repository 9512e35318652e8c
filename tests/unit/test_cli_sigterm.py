"""SIGTERM before ``kbatch serve`` installs its drain (consumer/cli/boundary.py
``terminate_on_sigterm``): one line and exit 143, what was opened closed, instead of a silent
143 from Python's default action.

The "broker" is a socket that accepts and never answers, so serve is still starting (waiting
on its topics) when the signal comes: no Kafka broker is needed, none is mocked.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer.cli.boundary import EXIT_TERMINATED, Terminated, run_cli, terminate_on_sigterm

KBATCH = str(Path(sys.executable).with_name("kbatch"))


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """``host:port`` of a listener that accepts connections and never writes a byte."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"127.0.0.1:{server.getsockname()[1]}"


def _wait_for(path: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not logged within {timeout_s} s: {path.read_text()}")
        time.sleep(0.05)  # polling a file the process writes, not waiting for an outcome


def test_sigterm_during_serves_start_up_is_one_line_and_exit_143(
    tmp_path: Path, silent_broker: str
) -> None:
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        serve = subprocess.Popen(
            [KBATCH, "serve", "--bootstrap", silent_broker, "--model", "sim:1,0.4",
             "--metrics-port", "0", "--no-run-jobs"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "KBATCH_DEBUG": ""},
        )  # fmt: skip
        try:
            # Logged once the settings are read; the topics are next, on a broker that never
            # answers: serve is starting, nothing consumed, when the signal comes.
            _wait_for(log, "effective config", 60)
            serve.send_signal(signal.SIGTERM)
            code = serve.wait(60)
        finally:
            serve.kill()
    text = log.read_text()
    assert code == EXIT_TERMINATED, text[-3000:]
    assert text.rstrip().endswith("terminated (SIGTERM) during start-up: nothing was consumed")
    for noise in ("Traceback", "Unclosed"):
        assert noise not in text, text[-3000:]


def test_terminated_reaches_the_boundary_as_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    import click

    def fail() -> None:
        raise Terminated("while testing")

    assert run_cli(click.Command("x", callback=fail), []) == EXIT_TERMINATED
    assert capsys.readouterr().err == "terminated (SIGTERM) while testing\n"


def test_the_handler_raises_terminated_in_the_main_thread() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        terminate_on_sigterm("in a test")
        with pytest.raises(Terminated, match="in a test"):
            signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
