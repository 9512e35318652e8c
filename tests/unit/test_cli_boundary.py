"""The ``kbatch`` error boundary (consumer/cli/boundary.py): one line per failure."""

from __future__ import annotations

import click
import pytest

from consumer.broker.local import BrokerError
from consumer.cli.boundary import DEBUG_ENV, EXIT_INTERRUPTED, run_cli


def _command(error: BaseException) -> click.Command:
    def fail() -> None:
        raise error

    return click.Command("x", callback=fail)


def test_kbatchs_own_error_is_its_message_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(_command(BrokerError("port 9 is taken")), []) == 1
    assert capsys.readouterr().err == "Error: port 9 is taken\n"


def test_an_unexpected_error_is_one_line_with_the_debug_hint(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert run_cli(_command(KeyError("lost\nkey")), []) == 1
    assert capsys.readouterr().err == (
        "Error: unexpected KeyError: 'lost\\nkey' (KBATCH_DEBUG=1 prints the traceback)\n"
    )


def test_debug_lets_the_traceback_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(KeyError):
        run_cli(_command(KeyError("k")), [])


def test_ctrl_c_is_exit_130(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(_command(KeyboardInterrupt()), []) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == "interrupted"


def test_usage_errors_and_exits_keep_their_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(_command(click.UsageError("bad")), []) == 2
    assert "Error: bad" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        run_cli(_command(SystemExit(3)), [])
    assert exited.value.code == 3
