"""`kbatch broker start | stop | status` as a user runs them, on a port of its own."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from consumer.broker.local import LocalBroker
from tests.integration.harness import free_port_pair

KBATCH = str(Path(sys.executable).with_name("kbatch"))


def _kbatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KBATCH, "broker", *args], capture_output=True, text=True, timeout=180, env=env, check=False
    )


def _broker_pids(port: int) -> list[str]:
    out = subprocess.run(
        ["pgrep", "-f", f"broker-{port}/server.properties"], capture_output=True, text=True
    )
    return out.stdout.split()


def test_start_twice_status_stop() -> None:
    port = free_port_pair()
    try:
        first = _kbatch("start", "--port", str(port), "--fresh")
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip() == f"127.0.0.1:{port}"
        second = _kbatch("start", "--port", str(port))
        assert second.returncode == 0, second.stderr
        assert len(_broker_pids(port)) == 1
        assert _kbatch("status", "--port", str(port)).returncode == 0
    finally:
        stopped = _kbatch("stop", "--port", str(port))
    assert stopped.returncode == 0
    assert _kbatch("status", "--port", str(port)).returncode != 0
    assert _broker_pids(port) == []
    shutil.rmtree(LocalBroker(port=port).home, ignore_errors=True)


def test_port_held_by_another_program_gives_one_line_error() -> None:
    port = free_port_pair()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result = _kbatch("start", "--port", str(port))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"port {port} is taken" in lines[0]
    assert "docker-compose.yml" in lines[0]


def test_missing_java_is_named(tmp_path: Path) -> None:
    port = free_port_pair()
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))
    try:
        result = _kbatch("start", "--port", str(port), env=env)
    finally:  # the config written before java was looked up
        shutil.rmtree(LocalBroker(port=port).home, ignore_errors=True)
    assert result.returncode == 2
    assert "`java` not found" in result.stderr
