"""``kbatch bench quality --json`` on the tiny embedder: the report's keys and the gate's verdict
(speed is not asserted: benchmarks are commands, not timed tests)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from consumer.cli import cli


def _texts(path: Path) -> Path:
    lines = [("word " * n).strip() for n in (1, 40, 3, 17, 2, 60, 8, 5, 25, 1, 12, 30)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bench_quality_onnx_passes_against_torch_and_sentence_transformers(
    tiny_embed_dir: Path, tmp_path: Path, onnx_cache: Path
) -> None:
    args = ["bench", "quality", "--model", str(tiny_embed_dir), "--texts",
            str(_texts(tmp_path / "t.txt")), "--n", "12", "--batch-size", "5", "--threads", "1",
            "--backend", "onnx", "--json"]  # fmt: skip
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    for key in ("vs_torch_fp32", "vs_sentence_transformers", "torch_fp32_vs_sentence_transformers"):
        assert report[key]["n"] == 12
        assert report[key]["min_cosine"] >= 0.9999, (key, report[key])
        assert report[key]["label_agreement"] is None
    assert report["passes_gate"] is True and report["min_cosine_required"] == 0.999
    assert report["candidate_seq_per_s"] > 0 and report["ratio_candidate_vs_torch_fp32"] > 0
    assert report["setup"]["backend"] == "onnx" and report["setup"]["batch_size"] == 5


def test_bench_quality_refuses_int8_on_torch(tiny_embed_dir: Path) -> None:
    result = CliRunner().invoke(
        cli, ["bench", "quality", "--model", str(tiny_embed_dir), "--quantize", "int8"]
    )
    assert result.exit_code == 2 and "needs --backend onnx" in result.output


def test_bench_flags_are_the_model_and_batching_settings_of_serve(tiny_embed_dir: Path) -> None:
    """The bench takes --dtype, --torch-threads, --max-batch-size … from the settings groups:
    the same rules (check_backend) and bounds as kbatch serve."""
    model = ["--model", str(tiny_embed_dir)]
    onnx_bf16 = ["bench", "quality", *model, "--backend", "onnx", "--dtype", "bfloat16"]
    result = CliRunner().invoke(cli, onnx_bf16)
    assert result.exit_code == 2 and "--backend onnx runs float32" in result.output
    result = CliRunner().invoke(cli, ["bench", "engine", *model, "--max-batch-size", "5000"])
    assert result.exit_code == 2 and "5000 is not in the range 1<=x<=4096" in result.output
    result = CliRunner().invoke(cli, ["bench", "quality", *model, "--torch-threads", "0"])
    assert result.exit_code == 2 and "--torch-threads" in result.output
