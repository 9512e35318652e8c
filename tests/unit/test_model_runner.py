"""The torch runner on tiny random models loaded through the real path (save_pretrained)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.engine import Engine
from consumer.batching.stats import EngineStats
from consumer.batching.types import Batch, InferenceItem, ItemOutcome, TokenizedItem
from consumer.model.batch_runner import ModelRunner
from consumer.model.loader import load_runner
from consumer.model.tokenize import HFTokenizer, read_max_length
from consumer.model.torch_backend import (
    CPU_BF16_MIN_PADDED_TOKENS,
    Pooling,
    TorchBackend,
    read_pooling,
)
from tests.fixtures.tiny_models import (
    CLASSIFY_LABELS,
    SMALL_VOCAB_SIZE,
    build_small_vocab_embedder,
    minilm_dir,
)

TEXTS = [
    "ok",
    "The movie was surprisingly good, and the cast was wonderful.",
    "",
    "terrible " * 20,
    "A mid-length sentence about Kafka consumers and padded batches.",
]


def tokenize(model_dir: Path, texts: list[str]) -> list[TokenizedItem]:
    tok = HFTokenizer(model_dir)
    out = tok.tokenize([InferenceItem(i, t) for i, t in enumerate(texts)])
    assert all(isinstance(r, TokenizedItem) for r in out)
    return out  # type: ignore[return-value]


def batch(items: list[TokenizedItem]) -> Batch:
    return Batch(items, max(t.n_tokens for t in items), 0.0)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.fixture(scope="module")
def embed_runner(tiny_embed_dir: Path) -> ModelRunner:
    return load_runner(tiny_embed_dir, device="cpu")


@pytest.fixture(scope="module")
def classify_runner(tiny_classify_dir: Path) -> ModelRunner:
    return load_runner(tiny_classify_dir, device="cpu")


def test_embed_in_a_mixed_length_batch_equals_single_item(
    embed_runner: ModelRunner, tiny_embed_dir: Path
) -> None:
    items = tokenize(tiny_embed_dir, TEXTS)
    assert len({t.n_tokens for t in items}) == len(items)  # really mixed lengths
    together = embed_runner.run(batch(items))
    for t, run in zip(items, together, strict=True):
        alone = embed_runner.run(batch([t]))[0]
        assert run.result is not None and alone.result is not None
        assert cosine(run.result["embedding"], alone.result["embedding"]) >= 0.9999
        assert run.result["dim"] == 32 == len(run.result["embedding"])
        assert math.sqrt(sum(x * x for x in run.result["embedding"])) == pytest.approx(1.0)
        assert run.batch_size == len(items) and run.padded_len == max(x.n_tokens for x in items)


def test_classify_in_a_mixed_length_batch_equals_single_item(
    classify_runner: ModelRunner, tiny_classify_dir: Path
) -> None:
    items = tokenize(tiny_classify_dir, TEXTS)
    together = classify_runner.run(batch(items))
    for t, run in zip(items, together, strict=True):
        alone = classify_runner.run(batch([t]))[0]
        assert run.result is not None and alone.result is not None
        assert run.result["label"] == alone.result["label"]
        scores: dict[str, float] = run.result["scores"]
        assert set(scores) == set(CLASSIFY_LABELS.values())
        assert sum(scores.values()) == pytest.approx(1.0, abs=1e-6)
        assert run.result["score"] == max(scores.values())
        assert scores[run.result["label"]] == run.result["score"]
        for label, p in scores.items():
            assert p == pytest.approx(alone.result["scores"][label], abs=1e-5)


def test_task_is_detected_from_the_architecture(
    embed_runner: ModelRunner, classify_runner: ModelRunner
) -> None:
    assert embed_runner.task == "embed" and classify_runner.task == "classify"
    assert embed_runner.max_length == 64 and classify_runner.max_length == 128


class OOMOnce(TorchBackend):
    """Out of memory for any batch larger than two items."""

    def __init__(self, inner: TorchBackend) -> None:
        self.__dict__.update(inner.__dict__)

    def forward(self, prepared: object) -> list[dict[str, Any]]:
        if prepared.ids.shape[0] > 2:  # type: ignore[attr-defined]
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate (injected)")
        return super().forward(prepared)


def test_injected_oom_splits_and_still_answers_all(
    embed_runner: ModelRunner, tiny_embed_dir: Path
) -> None:
    assert isinstance(embed_runner.backend, TorchBackend)
    stats = EngineStats()
    runner = ModelRunner(OOMOnce(embed_runner.backend), stats=stats)
    items = tokenize(tiny_embed_dir, TEXTS + TEXTS[:3])  # 8 items → 4 → 2
    runs = runner.run(batch(items))
    assert all(r.result is not None for r in runs)
    assert stats.splits == 3 and stats.batches == 4
    assert all(r.batch_size == 2 for r in runs)
    reference = embed_runner.run(batch(items))
    for r, ref in zip(runs, reference, strict=True):
        assert r.result is not None and ref.result is not None
        assert cosine(r.result["embedding"], ref.result["embedding"]) >= 0.9999


def test_a_single_failing_item_is_inference_failed(
    embed_runner: ModelRunner, tiny_embed_dir: Path
) -> None:
    class Broken(OOMOnce):
        def forward(self, prepared: object) -> list[dict[str, Any]]:
            raise RuntimeError("kernel exploded")

    assert isinstance(embed_runner.backend, TorchBackend)
    runs = ModelRunner(Broken(embed_runner.backend)).run(batch(tokenize(tiny_embed_dir, ["x"])))
    assert runs[0].result is None and runs[0].error_code == "inference_failed"


def test_pooling_and_max_length_are_read_from_the_model_files(
    tiny_embed_dir: Path, tiny_classify_dir: Path
) -> None:
    assert read_pooling(minilm_dir()) == Pooling("mean", normalize=True)
    assert read_max_length(minilm_dir()) == 256  # sentence_bert_config.json
    assert read_pooling(tiny_embed_dir) == Pooling("mean", normalize=True)
    assert read_pooling(tiny_classify_dir) == Pooling("mean", normalize=False)  # no modules.json


def test_cls_pooling_config_is_honoured(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "modules.json").write_text(
        '[{"path": "p", "type": "sentence_transformers.models.Pooling"}]'
    )
    (tmp_path / "p" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    assert read_pooling(tmp_path) == Pooling("cls", normalize=False)


async def test_engine_end_to_end_on_the_tiny_embedder(
    embed_runner: ModelRunner, tiny_embed_dir: Path
) -> None:
    outcomes: dict[int, ItemOutcome] = {}
    engine = Engine(
        embed_runner,
        HFTokenizer(tiny_embed_dir),
        BatchPolicyConfig(max_wait_ms=0.0, max_batch_tokens=512),
        lambda os: outcomes.update((o.item_id, o) for o in os),
        warmup="all",
    )
    await engine.start()
    texts = TEXTS * 4
    await engine.submit([InferenceItem(i, t, arrival_s=0.0) for i, t in enumerate(texts)])
    assert await engine.drain(timeout_s=60)
    await engine.stop()
    assert len(outcomes) == len(texts)
    singles = {
        t.item.text: embed_runner.run(batch([t]))[0] for t in tokenize(tiny_embed_dir, TEXTS)
    }
    for i, text in enumerate(texts):
        o = outcomes[i]
        ref = singles[text].result
        assert o.status == "ok" and o.result is not None and ref is not None
        assert cosine(o.result["embedding"], ref["embedding"]) >= 0.9999


async def test_a_model_with_a_40_token_vocabulary_warms_up_and_serves(tmp_path: Path) -> None:
    # Regression: warm-up filled its batches with token id 1000, an IndexError in the
    # embedding layer of any model with a vocabulary of 1000 tokens or fewer.
    model_dir = build_small_vocab_embedder(tmp_path / "small-vocab")
    runner = load_runner(model_dir, device="cpu")
    outcomes: dict[int, ItemOutcome] = {}
    engine = Engine(
        runner,
        HFTokenizer(model_dir),
        BatchPolicyConfig(max_wait_ms=0.0, max_batch_tokens=256),
        lambda os: outcomes.update((o.item_id, o) for o in os),
        warmup="all",
    )
    await engine.start()  # raised IndexError before the fix
    backend = runner.backend
    assert isinstance(backend, TorchBackend)
    assert 0 <= backend.warmup_token_id < SMALL_VOCAB_SIZE
    assert backend.warmup_token_id != backend.pad_token_id  # an ordinary token, not padding
    await engine.submit([InferenceItem(0, "mkvlaagllg", arrival_s=0.0)])
    assert await engine.drain(timeout_s=60)
    await engine.stop()
    assert outcomes[0].status == "ok" and outcomes[0].result is not None
    assert outcomes[0].result["dim"] == 32


def test_cpu_bf16_autocast_runs_full_batches_in_bf16_close_to_fp32(
    embed_runner: ModelRunner, tiny_embed_dir: Path
) -> None:
    """``--dtype bfloat16`` on the CPU: autocast over fp32 weights (the matrix multiplies in
    bf16) for a batch of at least CPU_BF16_MIN_PADDED_TOKENS, fp32 below; float32 results; a
    padded mixed-length batch close to fp32 row by row."""
    # eager: the hook below sees the modules' dtypes, which a TorchScript trace hides (the
    # traced path's own choice of batches: tests/unit/test_model_traced.py)
    bf16 = load_runner(tiny_embed_dir, device="cpu", autocast="bf16", trace=False)
    backend = bf16.backend
    assert isinstance(backend, TorchBackend) and backend.autocast_dtype == torch.bfloat16
    assert next(backend.model.parameters()).dtype == torch.float32  # weights stay fp32
    seen: list[torch.dtype] = []
    hook = backend.model.encoder.layer[0].attention.self.query.register_forward_hook(
        lambda _m, _i, out: seen.append(out.dtype)
    )
    items = tokenize(tiny_embed_dir, TEXTS * 8)  # mixed lengths, 40 rows
    full = batch(items)
    assert len(items) * full.padded_len >= CPU_BF16_MIN_PADDED_TOKENS
    try:
        low = bf16.run(full)
        bf16.run(batch(items[:1]))  # "ok": a few tokens
    finally:
        hook.remove()
    assert seen == [torch.bfloat16, torch.float32]  # full batch in bf16, the tiny one in fp32
    for fast, exact in zip(low, embed_runner.run(full), strict=True):
        assert fast.result is not None and exact.result is not None
        assert fast.result["pooled"].dtype.name == "float32"
        assert cosine(fast.result["embedding"], exact.result["embedding"]) >= 0.99


def test_fp16_autocast_on_the_cpu_is_refused(tiny_embed_dir: Path) -> None:
    with pytest.raises(ValueError, match="bfloat16"):
        load_runner(tiny_embed_dir, device="cpu", autocast="fp16")


def test_classify_is_refused_for_a_model_saved_without_a_classification_head(
    tiny_embed_dir: Path, tiny_classify_dir: Path
) -> None:
    """An embedding model (``architectures: [BertModel]``) would load with a random classifier
    and answer coin flips: ``--task classify`` refuses it, before anything starts."""
    from click.testing import CliRunner

    from consumer.cli import cli
    from consumer.config import ModelSettings
    from consumer.model.loader import check_task

    with pytest.raises(ValueError, match="no classification head"):
        check_task(ModelSettings(model=str(tiny_embed_dir), task="classify"), tiny_embed_dir)
    check_task(ModelSettings(model=str(tiny_classify_dir), task="classify"), tiny_classify_dir)
    check_task(ModelSettings(model=str(tiny_embed_dir), task="embed"), tiny_embed_dir)
    args = ["serve", "--model", str(tiny_embed_dir), "--task", "classify"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "no classification head" in result.output


def test_rerank_is_refused_for_a_classifier_with_more_than_one_label(
    tiny_classify_dir: Path,
) -> None:
    """A 3-label classifier has the sequence-classification head but no single relevance
    logit: ``--task rerank`` refuses it in one line before anything starts (it was a traceback
    from the backend)."""
    from click.testing import CliRunner

    from consumer.cli import cli
    from consumer.config import ModelSettings
    from consumer.model.loader import check_task

    with pytest.raises(ValueError, match="one output"):
        check_task(ModelSettings(model=str(tiny_classify_dir), task="rerank"), tiny_classify_dir)
    result = CliRunner().invoke(
        cli, ["serve", "--model", str(tiny_classify_dir), "--task", "rerank"]
    )
    assert result.exit_code == 2 and "3 labels" in result.output
    assert "Traceback" not in result.output
