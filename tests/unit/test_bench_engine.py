"""``kbatch bench engine --json`` on a tiny model: the report's shape and its invariants.

Speed is not asserted here (benchmarks are commands, not timed tests); what is checked is that
the command runs end to end through the real engine and reports every key the issue names.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from consumer.cli import cli


def _texts(path: Path, n: int = 60) -> Path:
    rng = random.Random(3)
    words = ["good", "bad", "movie", "plot", "slow", "great", "meh", "ok"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bench_engine_json_reports_every_strategy_and_the_bound(
    tiny_embed_dir: Path, tmp_path: Path
) -> None:
    texts = _texts(tmp_path / "texts.txt")
    args = f"bench engine --n 60 --seconds 0.5 --threads 1 --json --texts {texts}".split()
    result = CliRunner().invoke(
        cli, [*args, "--model", str(tiny_embed_dir)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    for name in ("single", "fixed", "bucketed"):
        row = report[name]
        for key in ("seq_per_s", "tokens_per_s", "padding_efficiency", "p50_ms", "p99_ms"):
            assert isinstance(row[key], int | float), (name, key)
        assert row["failed"] == 0
        assert 0.0 < row["padding_efficiency"] <= 1.0
    assert report["single"]["padding_efficiency"] == 1.0  # one item per batch: no padding
    assert report["ratio_bucketed_vs_single"] > 0 and report["ratio_bucketed_vs_fixed"] > 0
    bucketed = report["bucketed"]
    assert report["bucketed_p99_bound_ms"] == round(10.0 + 2 * bucketed["batch_ms_max"], 1)
    assert report["bucketed_p99_within_bound"] == (
        bucketed["p99_ms"] <= report["bucketed_p99_bound_ms"]
    )
    assert report["bucketed_p99_bound_p99_batch_ms"] == round(
        10.0 + 2 * bucketed["batch_ms_p99"], 1
    )
    assert report["setup"]["paced_rate_basis"] == "0.5 x single backlog seq/s"
    assert report["setup"]["paced_rate_per_s"] == pytest.approx(
        0.5 * report["single"]["seq_per_s"], rel=0.01, abs=0.1
    )
    assert report["bucketed"]["paced_model_busy_fraction"] >= 0.0


def test_bench_engine_rejects_an_unknown_strategy(tiny_embed_dir: Path, tmp_path: Path) -> None:
    texts = _texts(tmp_path / "t.txt", 5)
    args = f"bench engine --texts {texts} --strategies single,bogus".split()
    result = CliRunner().invoke(cli, [*args, "--model", str(tiny_embed_dir)])
    assert result.exit_code == 2
    assert "strategies" in result.output
