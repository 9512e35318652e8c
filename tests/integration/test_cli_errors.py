"""What an operator meets when a command cannot run: the real ``kbatch`` console script, one
error line naming what was wrong and where it came from, the exit code, no traceback and no
"Unclosed AIOKafka…" at exit."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tests.conftest import unique_group
from tests.integration.harness import KBATCH

USAGE = 2
FAILURE = 1


def kbatch(
    args: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``kbatch ARGS`` to its end; stdout and stderr captured."""
    return subprocess.run(
        [KBATCH, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={**os.environ, **(env or {})},
    )


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The ``Error:`` lines of stderr, after checking nothing noisy came with them."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "Unclosed" not in proc.stderr, proc.stderr[-3000:]
    return [line for line in proc.stderr.splitlines() if line.startswith("Error:")]


def test_a_config_file_that_is_not_yaml_is_one_line_with_its_line_and_column(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_batch_size: [\n")
    proc = kbatch(["serve", "--config", str(bad)])
    assert proc.returncode == USAGE
    assert error_lines(proc) == [
        f"Error: {bad}: not valid YAML: line 2, column 1: expected the node content, "
        "but found '<stream end>'"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_batch_sise: 8\n", "max_batch_sise: unknown setting (did you mean max_batch_size?)"),
        (
            "max-batch-size: 8\n",
            "max-batch-size: unknown setting (keys are spelled with underscores: max_batch_size)",
        ),
        ("max_batch_size: abc\n", "max_batch_size: not an integer (got 'abc')"),
        ("- 8\n", "a mapping of settings is expected (max_batch_size: 32), not a list"),
    ],
)
def test_a_bad_config_file_key_is_named_with_its_file(
    tmp_path: Path, text: str, expected: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    proc = kbatch(["serve", "--config", str(bad)])
    assert proc.returncode == USAGE
    assert error_lines(proc) == [f"Error: {bad}: {expected}"]


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("KBATCH_MAX_BATCH_SIZE", "abc", "KBATCH_MAX_BATCH_SIZE=abc: not an integer"),
        ("KBATCH_MAX_WAIT_MS", "soon", "KBATCH_MAX_WAIT_MS=soon: not a number"),
        ("KBATCH_BUCKET_EDGES", "16,x", "KBATCH_BUCKET_EDGES=16,x: item 2: not an integer"),
    ],
)
def test_a_bad_variable_is_named_as_the_variable_with_its_value(
    variable: str, value: str, expected: str
) -> None:
    proc = kbatch(["serve"], env={variable: value})
    assert proc.returncode == USAGE
    assert error_lines(proc) == [f"Error: {expected}"]


def test_a_flag_wins_over_a_bad_variable_and_a_bad_flag_is_named_as_the_flag() -> None:
    proc = kbatch(["serve", "--max-batch-size", "0"], env={"KBATCH_MAX_BATCH_SIZE": "abc"})
    assert proc.returncode == USAGE
    assert error_lines(proc) == [
        "Error: --max-batch-size: Input should be greater than or equal to 1 (got 0)"
    ]


def test_a_list_variable_takes_the_flags_comma_form(tmp_path: Path) -> None:
    # Accepted (then stopped by the next check, before anything starts).
    proc = kbatch(["serve", "--max-batch-tokens", "10"], env={"KBATCH_BUCKET_EDGES": "16,32,64"})
    assert proc.returncode == USAGE
    assert error_lines(proc)[0].startswith("Error: --max-batch-tokens 10 cannot hold")


@pytest.mark.parametrize("command", [["serve"], ["backfill", "--source-topic", "s",
                                                  "--output-topic", "o", "--from", "earliest",
                                                  "--to", "latest"]])  # fmt: skip
def test_a_token_budget_below_one_request_is_a_usage_error_before_anything_starts(
    command: list[str],
) -> None:
    started = time.monotonic()
    proc = kbatch([*command, "--max-batch-tokens", "10", "--bootstrap", "127.0.0.1:1"])
    assert proc.returncode == USAGE
    assert error_lines(proc) == [
        "Error: --max-batch-tokens 10 cannot hold one request of the model's maximum length, "
        "256 tokens: give at least 256 (or a smaller --max-length)"
    ]
    assert "effective config" not in proc.stderr  # nothing started: no model, no Kafka
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("broken", ["config", "weights"])
def test_a_broken_model_directory_is_one_line_naming_what_is_wrong(
    tmp_path: Path, broken: str
) -> None:
    """A ``config.json`` that is not JSON, or no weights: one usage error before anything
    starts (before, a transformers traceback, or "cannot tell the model's maximum length")."""
    model = tmp_path / "model"
    model.mkdir()
    config = '{"model_type": "bert", "architectures": ["BertModel"]}'
    (model / "config.json").write_text("{broken" if broken == "config" else config)
    proc = kbatch(["serve", "--model", str(model), "--bootstrap", "127.0.0.1:1"])
    assert proc.returncode == USAGE
    expected = (
        f"Error: {model}/config.json: not valid JSON (Expecting property name"
        if broken == "config"
        else f"Error: {model}: no model weights (model.safetensors or pytorch_model.bin)"
    )
    (line,) = error_lines(proc)
    assert line.startswith(expected), line


def test_a_backfill_without_a_broker_is_one_line_and_closes_its_clients() -> None:
    proc = kbatch(
        ["backfill", "--source-topic", "s", "--output-topic", "o", "--from", "earliest",
         "--to", "latest", "--bootstrap", "127.0.0.1:1"]
    )  # fmt: skip
    assert proc.returncode == FAILURE
    assert error_lines(proc) == [  # the live-group check at start is the first to ask
        "Error: no Kafka broker answered at 127.0.0.1:1: "
        "[Errno 111] Connect call failed ('127.0.0.1', 1)"
    ]


def test_a_demo_on_a_taken_broker_port_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = kbatch(["demo", "--broker-port", str(port)])
    assert proc.returncode == FAILURE
    (line,) = error_lines(proc)
    assert line.startswith(f"Error: port {port} is taken by another program"), proc.stderr
    assert "`kbatch demo --broker-port N`" in line  # the remedy names the demo's own flag


def test_e_a_taken_metrics_port_is_found_before_the_model_loads(
    kafka_bootstrap: str, tiny_embed_dir: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = kbatch(
            ["serve", "--model", str(tiny_embed_dir), "--metrics-port", str(port),
             "--bootstrap", kafka_bootstrap, "--request-topic", unique_group("port")]
        )  # fmt: skip
    assert proc.returncode == FAILURE
    error_lines(proc)
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"cannot serve metrics on 127.0.0.1:{port}" in errors[0]
    assert "kbatch.model" not in proc.stderr  # the CPU plan line: the model was never loaded
