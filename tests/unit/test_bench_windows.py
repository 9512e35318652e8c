"""``kbatch bench windows`` on the tiny embedder: a report of both cases, the
document really split into the asked windows, and the same tokens computed either way."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from consumer.bench.windows import WindowsBenchOptions, run_windows_bench
from consumer.cli import cli


def test_a_document_and_its_windows_as_requests_compute_the_same_tokens(
    tiny_embed_dir: Path,
) -> None:
    report = asyncio.run(
        run_windows_bench(WindowsBenchOptions(tiny_embed_dir, windows=3, repeats=1))
    )
    assert (report["windows"], report["task"], report["repeats"]) == (3, "embed", 1)
    doc, sep = report["document"], report["separate"]
    assert doc["real_tokens_per_run"] == sep["real_tokens_per_run"] > 3 * 50
    assert 0 < doc["padding_efficiency"] <= 1 and doc["model_ms_median"] > 0
    assert report["model_ms_ratio"] > 0 and isinstance(report["within_1_1x"], bool)


def test_the_command_prints_both_cases(tiny_embed_dir: Path) -> None:
    args = ["bench", "windows", "--model", str(tiny_embed_dir), "--windows", "2", "--repeats", "1"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    assert "document" in out.output and "separate" in out.output and "1.1x" in out.output
