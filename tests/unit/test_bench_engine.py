"""``kbatch bench engine --json`` on a tiny model: the report's shape and its invariants.

Speed is not asserted here (benchmarks are commands, not timed tests); what is checked is that
the command runs end to end through the real engine and reports every key BENCHMARKS.md reads.
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
    for name in ("single", "fixed", "bucketed"):  # model time within the backlog's wall time
        assert 0.0 < report[name]["backlog_model_busy_fraction"] <= 1.0, name


def test_bench_engine_baselines_and_their_ratios(tiny_embed_dir: Path, tmp_path: Path) -> None:
    texts = _texts(tmp_path / "texts.txt")
    args = f"bench engine --n 60 --seconds 0.3 --threads 1 --json --texts {texts}".split()
    result = CliRunner().invoke(
        cli,
        [*args, "--model", str(tiny_embed_dir), "--strategies",
         "single,plain_loop,sorted_offline,runner_loop", "--max-batch-tokens", "256"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert "fixed" not in report and "ratio_bucketed_vs_fixed" not in report
    plain, offline, loop = report["plain_loop"], report["sorted_offline"], report["runner_loop"]
    assert plain["backlog_batches"] == 60 and loop["backlog_batches"] == 60
    assert plain["padding_efficiency"] == 1.0
    # Sorted by length, cut by the same budget: padding only between neighbours in length,
    # and never more than the budget per batch.
    assert offline["padding_efficiency"] >= report["bucketed"]["padding_efficiency"] - 0.05
    assert offline["backlog_batches"] >= 60 * 10 // 256
    for key, num, den, figure in (
        ("ratio_single_vs_plain_loop", "single", "plain_loop", "seq_per_s"),
        ("ratio_bucketed_vs_sorted_offline", "bucketed", "sorted_offline", "seq_per_s"),
        ("ratio_bucketed_vs_plain_loop", "bucketed", "plain_loop", "seq_per_s"),
        ("ratio_single_batch_ms_vs_runner_loop", "single", "runner_loop", "backlog_batch_ms_p50"),
    ):
        digits = 3 if "batch_ms" in key else 2
        assert report[key] == round(report[num][figure] / report[den][figure], digits), key
    assert report["ratio_single_paced_batch_ms_vs_runner_loop"] == round(
        report["single"]["batch_ms_p50"] / loop["paced_batch_ms_p50"], 3
    )
    for row in (plain, offline, loop):  # batch times sum to at most the backlog's wall time
        assert 0.0 < row["backlog_model_busy_fraction"] <= 1.0
    assert report["setup"]["baselines"] == ["plain_loop", "sorted_offline", "runner_loop"]
    assert report["setup"]["backend"] == "torch"


def test_sorted_offline_cuts_sorted_batches_under_the_budget(tiny_embed_dir: Path) -> None:
    from consumer.model.baselines import PlainModel, sorted_offline

    model = PlainModel(tiny_embed_dir, max_length=64)
    texts = ["word " * n for n in (30, 1, 12, 5, 30, 2, 8)]
    run = sorted_offline(model, texts, max_batch_tokens=64, max_batch_size=3)
    lengths = model.lengths(texts)
    assert run.real_tokens == sum(lengths)
    assert run.padded_tokens >= run.real_tokens
    assert run.batches == len(run.batch_ms) >= 3  # 7 texts, at most 3 per batch
    # Each batch's padded size stays within the budget: rows × its longest ≤ 64.
    assert run.padded_tokens <= 64 * run.batches


def test_plain_model_matches_kbatch_embeddings(tiny_embed_dir: Path) -> None:
    from consumer.model.baselines import PlainModel
    from consumer.model.loader import load_runner
    from consumer.model.quality import compare_results, score_texts
    from consumer.model.tokenize import HFTokenizer

    texts = ["a", "the plot was slow but the ending was great", "meh"]
    plain = PlainModel(tiny_embed_dir, max_length=64).embed(texts)
    runner = load_runner(tiny_embed_dir, device="cpu")
    ours = score_texts(runner, HFTokenizer(tiny_embed_dir, max_length=64), texts)
    theirs = [{"embedding": row.tolist()} for row in plain]
    assert compare_results(ours, theirs).min_cosine > 0.99999


def test_bench_engine_rejects_an_unknown_strategy(tiny_embed_dir: Path, tmp_path: Path) -> None:
    texts = _texts(tmp_path / "t.txt", 5)
    args = f"bench engine --texts {texts} --strategies single,bogus".split()
    result = CliRunner().invoke(cli, [*args, "--model", str(tiny_embed_dir)])
    assert result.exit_code == 2
    assert "strategies" in result.output
