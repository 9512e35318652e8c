"""The rerank activation is the one ``CrossEncoder(dir).predict`` applies, for every layout the
installed sentence-transformers reads (consumer/model/cross_encoder.py).

Each layout is the tiny cross-encoder of ``tests/fixtures/task_models.py`` with files written
as a sentence-transformers version saves them (6.x: ``modules.json`` +
``config_sentence_transformers.json``; 4.x: ``config.json``'s ``sentence_transformers`` block;
before 4.0: ``sbert_ce_default_activation_function``; a plain transformers save: nothing), or
saved by the installed ``CrossEncoder.save`` itself. kbatch's scores, through its engine, must
equal ``CrossEncoder(dir).predict`` (within 1e-5); an activation kbatch cannot apply is refused
in one line before anything starts.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from consumer.batching.types import InferenceItem
from consumer.cli import cli
from consumer.config import ModelSettings
from consumer.model.cross_encoder import ST_CONFIG, read_activation, resolve_activation
from consumer.model.loader import check_model, load_runner
from consumer.model.tokenize import HFTokenizer
from tests.fixtures.task_models import build_tiny_cross_encoder
from tests.unit.test_task_parity import BATCHINGS, DOCUMENTS, QUERY, ok_result, run_engine

SIGMOID = "torch.nn.modules.activation.Sigmoid"  # what CrossEncoder.save writes (fullname)
IDENTITY = "torch.nn.modules.linear.Identity"
TRANSFORMER = "sentence_transformers.base.modules.transformer.Transformer"
MODULES = [{"idx": 0, "name": "0", "path": "", "type": TRANSFORMER}]  # as CrossEncoder.save
PRE4 = "sbert_ce_default_activation_function"


def st_config(activation: str | None, model_type: str = "CrossEncoder") -> dict[str, Any]:
    """A ``config_sentence_transformers.json`` as ``CrossEncoder.save`` (6.x) writes it."""
    return {"activation_fn": activation, "model_type": model_type, "prompts": {}}


# id → (files beside config.json, keys merged into config.json, kbatch's activation, source)
LAYOUTS: dict[str, tuple[dict[str, Any], dict[str, Any], str, str]] = {
    "transformers-only": ({}, {}, "sigmoid", "default (one label)"),
    "st6-identity": (
        {"modules.json": MODULES, ST_CONFIG: st_config(IDENTITY)}, {}, "identity", ST_CONFIG,
    ),
    "st6-sigmoid": (
        {"modules.json": MODULES, ST_CONFIG: st_config(SIGMOID)}, {}, "sigmoid", ST_CONFIG,
    ),
    "st6-file-over-config-json": (
        {"modules.json": MODULES, ST_CONFIG: st_config(IDENTITY)},
        {"sentence_transformers": {"activation_fn": SIGMOID}},
        "identity",
        ST_CONFIG,
    ),
    "st6-null-then-config-json": (
        {"modules.json": MODULES, ST_CONFIG: st_config(None)},
        {"sentence_transformers": {"activation_fn": IDENTITY}},
        "identity",
        "config.json sentence_transformers",
    ),
    "st6-file-without-modules-json": ({ST_CONFIG: st_config(IDENTITY)}, {}, "sigmoid", "default"),
    "st6-file-of-another-model-type": (
        {"modules.json": MODULES, ST_CONFIG: st_config(IDENTITY, "SentenceTransformer")},
        {},
        "sigmoid",
        "default",
    ),
    "st6-untrusted-path-then-config-json": (
        {"modules.json": MODULES, ST_CONFIG: st_config("mypackage.Scaled")},
        {"sentence_transformers": {"activation_fn": IDENTITY}},
        "identity",
        "config.json sentence_transformers",
    ),
    "st6-alias-spelling": (
        {"modules.json": MODULES, ST_CONFIG: st_config("torch.nn.modules.Identity")},
        {},
        "identity",
        ST_CONFIG,
    ),
    "st4-config-json": (
        {}, {"sentence_transformers": {"activation_fn": IDENTITY}}, "identity", "config.json",
    ),
    "st4-null-stops-before-pre4-key": (
        {},
        {"sentence_transformers": {"activation_fn": None}, PRE4: IDENTITY},
        "sigmoid",
        "default",
    ),
    "pre4-config-json": ({}, {PRE4: IDENTITY}, "identity", f"config.json {PRE4}"),
}  # fmt: skip


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny cross-encoder as transformers saves it (``config.json`` only)."""
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("ce") / "base")


def write_layout(base: Path, target: Path, files: dict[str, Any], config: dict[str, Any]) -> Path:
    """A copy of ``base`` with ``files`` written as JSON and ``config`` merged into config.json."""
    shutil.copytree(base, target)
    for name, content in files.items():
        (target / name).write_text(json.dumps(content))
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(cfg | config))
    return target


def reference_activation(model_dir: Path) -> str:
    """The activation the installed ``CrossEncoder`` loads for ``model_dir``."""
    from sentence_transformers import CrossEncoder

    fn = CrossEncoder(str(model_dir), device="cpu").activation_fn
    return {torch.nn.Sigmoid: "sigmoid", torch.nn.Identity: "identity"}.get(type(fn), repr(fn))


async def assert_scores_equal_predict(model_dir: Path) -> list[float]:
    """kbatch's rerank scores (engine, fan-out, mixed batches) equal ``predict``'s; returned."""
    from sentence_transformers import CrossEncoder

    runner = load_runner(model_dir, task="rerank", device="cpu")
    item = InferenceItem(0, QUERY, documents=tuple(DOCUMENTS), arrival_s=0.0)
    outcomes = await run_engine(
        runner, HFTokenizer(model_dir), [item], BATCHINGS["mixed"], fan_out=True
    )
    scores: list[float] = ok_result(outcomes[0])["scores"]
    expected = CrossEncoder(str(model_dir), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    assert np.allclose(scores, expected, atol=1e-5, rtol=0), (scores, expected.tolist())
    return scores


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_activation_is_the_one_cross_encoder_loads(
    base_dir: Path, tmp_path: Path, layout: str, caplog: pytest.LogCaptureFixture
) -> None:
    files, config, expected, source = LAYOUTS[layout]
    model_dir = write_layout(base_dir, tmp_path / layout, files, config)
    with caplog.at_level(logging.WARNING):
        assert read_activation(model_dir) == expected
        assert resolve_activation(model_dir).source.startswith(source)
    assert reference_activation(model_dir) == expected  # the table is the library's truth
    if "untrusted" in layout:  # ignored with a warning, as sentence-transformers does
        assert any("mypackage.Scaled" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("activation", ["identity", "sigmoid"])
async def test_scores_of_a_cross_encoder_saved_by_sentence_transformers_equal_predict(
    base_dir: Path, tmp_path: Path, activation: str
) -> None:
    """Regression: ``CrossEncoder(…, activation_fn=Identity()).save(dir)`` (the
    installed version writes it to config_sentence_transformers.json) was scored with Sigmoid."""
    from sentence_transformers import CrossEncoder

    fn = torch.nn.Identity() if activation == "identity" else torch.nn.Sigmoid()
    saved = tmp_path / "saved"
    CrossEncoder(str(base_dir), device="cpu", activation_fn=fn).save(str(saved))
    assert json.loads((saved / ST_CONFIG).read_text())["activation_fn"].endswith(type(fn).__name__)
    scores = await assert_scores_equal_predict(saved)
    assert (min(scores) < 0 or max(scores) > 1) == (activation == "identity")  # raw logits


@pytest.mark.parametrize("layout", ["transformers-only", "st4-config-json", "pre4-config-json"])
async def test_scores_of_a_config_json_only_model_equal_predict(
    base_dir: Path, tmp_path: Path, layout: str
) -> None:
    files, config, _, _ = LAYOUTS[layout]
    await assert_scores_equal_predict(write_layout(base_dir, tmp_path / layout, files, config))


def test_an_activation_kbatch_cannot_apply_is_refused_in_one_line(
    base_dir: Path, tmp_path: Path
) -> None:
    from sentence_transformers import CrossEncoder

    saved = tmp_path / "tanh"
    CrossEncoder(str(base_dir), device="cpu", activation_fn=torch.nn.Tanh()).save(str(saved))
    with pytest.raises(ValueError, match=r"activation is torch\.nn\.modules\.activation\.Tanh"):
        check_model(ModelSettings(model=str(saved), task="rerank"))
    result = CliRunner().invoke(cli, ["serve", "--model", str(saved), "--task", "rerank"])
    assert result.exit_code == 2, result.output
    error_lines = [line for line in result.output.splitlines() if "Tanh" in line]
    assert len(error_lines) == 1 and "Sigmoid and torch.nn.Identity" in error_lines[0]
    assert "Traceback" not in result.output
