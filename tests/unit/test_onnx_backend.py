"""The ONNX Runtime backend on tiny models: export round trip with padded mixed-length batches,
the export cache, and the settings that refuse impossible combinations."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from consumer.config import ModelSettings
from consumer.model import onnx_backend
from consumer.model.batch_runner import ModelRunner
from consumer.model.loader import load_runner
from consumer.model.quality import compare_results, score_texts
from consumer.model.tokenize import HFTokenizer

# Lengths from 1 to ~60 tokens in one batch: rows padded by up to ~55 tokens.
MIXED = [
    "a",
    "The committee met on Tuesday to discuss the budget for the coming fiscal year, and "
    "after a long debate about infrastructure spending it agreed to postpone the vote.",
    "fine",
    "I loved it, really!",
    "no no no no no no no no no no no no no no no no no no no no no no no no no no",
    "ok",
]


def _pair(model_dir: Path) -> tuple[ModelRunner, ModelRunner, HFTokenizer]:
    torch_runner = load_runner(model_dir, device="cpu")
    onnx_runner = load_runner(model_dir, device="cpu", backend="onnx", threads=1)
    return torch_runner, onnx_runner, HFTokenizer(model_dir, max_length=torch_runner.max_length)


@pytest.mark.parametrize("batch_size", [1, len(MIXED)])
def test_onnx_embed_matches_torch_in_padded_mixed_batches(
    onnx_cache: Path, tiny_embed_dir: Path, batch_size: int
) -> None:
    ref, onnx, tok = _pair(tiny_embed_dir)
    a = score_texts(ref, tok, MIXED, batch_size=batch_size)
    b = score_texts(onnx, tok, MIXED, batch_size=batch_size)
    report = compare_results(a, b)
    assert report.min_cosine > 0.99999, report
    for x, y in zip(a, b, strict=True):
        assert x is not None and y is not None
        assert y["dim"] == x["dim"] == 32
        assert max(abs(p - q) for p, q in zip(x["embedding"], y["embedding"], strict=True)) < 1e-4


def test_onnx_padded_row_equals_the_same_text_alone(onnx_cache: Path, tiny_embed_dir: Path) -> None:
    # A wrong export (shapes or a full mask baked in) answers single texts right and padded
    # rows wrong: the same text must embed the same alone and padded among longer ones.
    _, onnx, tok = _pair(tiny_embed_dir)
    alone = score_texts(onnx, tok, MIXED, batch_size=1)
    padded = score_texts(onnx, tok, MIXED, batch_size=len(MIXED))
    assert compare_results(alone, padded).min_cosine > 0.99999


def test_onnx_classify_matches_torch(onnx_cache: Path, tiny_classify_dir: Path) -> None:
    ref, onnx, tok = _pair(tiny_classify_dir)
    report = compare_results(
        score_texts(ref, tok, MIXED, batch_size=4), score_texts(onnx, tok, MIXED, batch_size=4)
    )
    assert report.label_agreement == 1.0
    assert report.max_abs_delta_score is not None and report.max_abs_delta_score < 1e-4


def test_export_is_cached_by_key(
    onnx_cache: Path, tiny_embed_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = onnx_backend.ensure_onnx(tiny_embed_dir, "embed")
    assert first.parent.parent == onnx_cache
    assert first.parent.name == onnx_backend.cache_key(tiny_embed_dir, "embed", "none")

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(onnx_backend, "export_onnx", boom)
    assert onnx_backend.ensure_onnx(tiny_embed_dir, "embed") == first


@pytest.mark.parametrize("task", ["embed", "classify"])
def test_export_is_fused_so_the_round_trips_cover_the_fused_graph(
    onnx_cache: Path, tiny_embed_dir: Path, tiny_classify_dir: Path, task: str
) -> None:
    # The padded mixed-length round trips above run this file: it must hold ORT's fused
    # transformer operators (Attention reads the padding mask itself), not the plain graph.
    import onnx

    model_dir = tiny_embed_dir if task == "embed" else tiny_classify_dir
    graph = onnx.load(str(onnx_backend.ensure_onnx(model_dir, task))).graph  # type: ignore[arg-type]
    ops = {(n.domain, n.op_type) for n in graph.node}
    for op in ("Attention", "SkipLayerNormalization", "EmbedLayerNormalization"):
        assert ("com.microsoft", op) in ops, sorted(ops)
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask"]


def test_cache_key_changes_with_the_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A changed export/fusion recipe must not reuse a file cached by the old one.
    (tmp_path / "config.json").write_text("{}")
    base = onnx_backend.cache_key(tmp_path, "embed", "none")
    monkeypatch.setattr(onnx_backend, "_FP32_RECIPE", "another-recipe")
    assert onnx_backend.cache_key(tmp_path, "embed", "none") != base


def test_cache_key_changes_with_weights_task_and_quantize(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights-1")
    base = onnx_backend.cache_key(tmp_path, "embed", "none")
    assert onnx_backend.cache_key(tmp_path, "classify", "none") != base
    assert onnx_backend.cache_key(tmp_path, "embed", "int8") != base
    (tmp_path / "model.safetensors").write_bytes(b"weights-2")
    assert onnx_backend.cache_key(tmp_path, "embed", "none") != base


def test_session_options_do_not_spin() -> None:
    so = onnx_backend.session_options(2)
    assert so.intra_op_num_threads == 2
    assert so.inter_op_num_threads == 1
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_int8_needs_onnx_and_onnx_needs_cpu() -> None:
    with pytest.raises(ValidationError, match="--quantize int8 needs --backend onnx"):
        ModelSettings(quantize="int8")
    with pytest.raises(ValidationError, match="runs on the CPU"):
        ModelSettings(backend="onnx", device="cuda")
    assert ModelSettings(backend="onnx", quantize="int8").quantize == "int8"


def test_dtype_is_torchs_autocast_and_float16_needs_cuda() -> None:
    with pytest.raises(ValidationError, match="--backend onnx runs float32"):
        ModelSettings(backend="onnx", dtype="bfloat16")
    with pytest.raises(ValidationError, match="needs CUDA"):
        ModelSettings(device="cpu", dtype="float16")
    assert ModelSettings(device="cpu", dtype="bfloat16").dtype == "bfloat16"


def test_load_runner_refuses_int8_on_torch(tiny_embed_dir: Path) -> None:
    with pytest.raises(ValueError, match="needs --backend onnx"):
        load_runner(tiny_embed_dir, device="cpu", quantize="int8")
