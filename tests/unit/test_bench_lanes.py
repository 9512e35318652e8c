"""``kbatch bench lanes``' goals (pure)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from consumer.bench.lanes import lanes_goals
from consumer.cli import cli


def test_goals_met_and_missed() -> None:
    met = lanes_goals(
        drain_seq_per_s=100.0, rate_per_s=30.0, p99_alone_ms=40.0, p99_with_job_ms=55.0,
        batch_ms=10.0, job_seq_per_s=60.0,
    )  # fmt: skip
    assert met["p99_goal_ms"] == 60.0 and met["p99_ok"] and met["p99_ratio"] == pytest.approx(0.917)
    assert met["job_goal_seq_per_s"] == 56.0 and met["job_ok"] and met["job_ratio"] == 1.071
    missed = lanes_goals(
        drain_seq_per_s=100.0, rate_per_s=60.0, p99_alone_ms=40.0, p99_with_job_ms=61.0,
        batch_ms=10.0, job_seq_per_s=31.9,
    )  # fmt: skip
    assert (missed["p99_ok"], missed["job_ok"]) == (False, False)
    assert missed["job_goal_seq_per_s"] == 32.0


def test_fractions_outside_0_1_are_a_usage_error() -> None:
    out = CliRunner().invoke(cli, ["bench", "lanes", "--fractions", "0.3,1.2"])
    assert out.exit_code == 2 and "fractions in (0, 1)" in out.output
